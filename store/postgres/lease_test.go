package postgres

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestLeaseRenewalIsHOT: a lease renewal changes claimed_at only, which no
// index keys or filters on, so PostgreSQL updates the rows in place (HOT:
// no index entry written), and a processor renewing the leases of a slow
// publish does not grow the indexes. It fails if claimed_at (or anything
// else the renewal sets) enters an index.
func TestLeaseRenewalIsHOT(t *testing.T) {
	s, pg, ctx := migratedStore(t, Options{})
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	var msgs []outbox.Message
	for i := range 6 {
		msgs = append(msgs, outbox.Message{Topic: "t", Group: []string{"a", "b", ""}[i%3], Payload: json.RawMessage(`{}`)})
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != len(msgs) {
		t.Fatalf("claimed %d, want %d", len(claimed), len(msgs))
	}
	ids := make([]string, len(claimed))
	att := make([]int32, len(claimed))
	toks := make([]string, len(claimed))
	for i, m := range claimed {
		ids[i], att[i], toks[i] = m.ID, int32(m.Attempts), m.ClaimToken //nolint:gosec // small
	}
	// The renewal's own statement, in a transaction whose statistics
	// (pg_stat_xact_user_tables) count its updates and the HOT ones.
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The backend's counts may include earlier transactions' not yet
	// reported: the renewal's are the difference.
	counts := func() (upd, hot int64) {
		t.Helper()
		if err := tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`,
			s.messages).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		return upd, hot
	}
	upd0, hot0 := counts()
	tag, err := tx.Exec(ctx, s.sql.extend, time.Now(), "p", ids, att, toks)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != int64(len(ids)) {
		t.Fatalf("renewed %d leases, want %d", tag.RowsAffected(), len(ids))
	}
	upd, hot := counts()
	upd, hot = upd-upd0, hot-hot0
	if upd != int64(len(ids)) || hot != upd {
		t.Fatalf("the renewal updated %d rows, %d of them HOT: want every one HOT", upd, hot)
	}
}
