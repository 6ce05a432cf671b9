package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// TestElectorConformance runs the election cases of the conformance suite
// against the GET_LOCK Elector, each on a fresh database.
func TestElectorConformance(t *testing.T) {
	t.Parallel()
	storetest.RunElector(t, storetest.ElectorHarness{NewElection: func(t *testing.T) storetest.Election {
		st, d := newStore(t, mysql.Options{})
		opts := mysql.ElectorOptions{RetryInterval: 100 * time.Millisecond, CheckInterval: 100 * time.Millisecond}
		name := mysql.ElectorLockName(st.Elector(opts), d.Name)
		return storetest.Election{
			New: func(*testing.T) storetest.Elector { return st.Elector(opts) },
			Held: func(ctx context.Context) (bool, error) {
				var holder sql.NullInt64
				err := d.DB.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?)`, name).Scan(&holder)
				return holder.Valid, err
			},
			Sever: func(ctx context.Context, _ storetest.Elector) error {
				var holder sql.NullInt64
				if err := d.DB.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?)`, name).Scan(&holder); err != nil {
					return err
				}
				if !holder.Valid {
					return fmt.Errorf("no session holds %s", name)
				}
				_, err := d.DB.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", holder.Int64))
				return err
			},
			Bound: opts.RetryInterval + opts.CheckInterval,
		}
	}})
}

// The lock is named after the database, so that two outboxes with the same
// tables in two databases of one server (lock names are global to the
// server) elect a leader each; a name over GET_LOCK's 64 characters is
// hashed.
func TestElectorLockName(t *testing.T) {
	t.Parallel()
	st, err := mysql.New(&sql.DB{}, mysql.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := st.Elector(mysql.ElectorOptions{})
	if a, b := mysql.ElectorLockName(e, "shop"), mysql.ElectorLockName(e, "billing"); a == b {
		t.Fatalf("one lock name %q for two databases", a)
	}
	if got, want := mysql.ElectorLockName(e, "shop"), "outboxkit:shop.outbox_messages:processor"; got != want {
		t.Fatalf("lock name %q, want %q", got, want)
	}
	long := mysql.ElectorLockName(st.Elector(mysql.ElectorOptions{Name: strings.Repeat("x", 60)}), "shop")
	if len(long) > 64 || !strings.HasPrefix(long, "outboxkit:") {
		t.Fatalf("lock name %q: more than 64 characters or not ours", long)
	}
}
