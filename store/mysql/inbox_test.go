package mysql_test

import (
	"context"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// TestInboxClientFoundRows: with the DSN's clientFoundRows a duplicate
// affects 1 row, like an insert; InboxClaimTx still tells them apart, and
// a claim after a duplicate is first again for another message.
func TestInboxClientFoundRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := testbackend.MySQL(t, 4)
	db := openDSN(t, d.DSN, func(cfg *gomysql.Config) { cfg.ClientFoundRows = true })
	plain, _ := mysql.New(d.DB, mysql.Options{})
	found, _ := mysql.New(db, mysql.Options{})
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for tenant, s := range map[string]*mysql.Store{"plain": plain, "found": found} {
		for i, c := range []struct {
			id   string
			want bool
		}{{"a", true}, {"a", false}, {"b", true}, {"b", false}} {
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			first, err := s.InboxClaimTx(ctx, tx, outbox.InboxClaimParams{Consumer: "c", Tenant: tenant, MessageID: c.id, Now: now})
			if err != nil || first != c.want {
				_ = tx.Rollback()
				t.Fatalf("%s: claim %d (%s): %v, %v; want %v", tenant, i+1, c.id, first, err, c.want)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
