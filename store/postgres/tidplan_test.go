package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// TestWritePathPlans pins the access paths that keep the work per drained
// message low, on a table analysed while nothing was PROCESSING (a fresh or
// just-analysed table) with another processor's leases in it: the claim
// locks and updates its rows by tuple ID, and the outcome statement finds
// its rows by tuple ID, never by scanning the lease index (which the
// planner, trusting those statistics, otherwise chose, checking every
// leased row of every processor), with or without delete on send.
func TestWritePathPlans(t *testing.T) {
	for _, del := range []bool{false, true} {
		t.Run(fmt.Sprintf("delete-sent=%v", del), func(t *testing.T) {
			pg := testbackend.Postgres(t, 2)
			opts := Options{Schema: pg.Name}
			if del {
				opts.DeleteSentTopics = []string{"t"}
			}
			s, err := New(pg.Pool, opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, 'default', 't', 'g' || (i %% 100), 'k' || i, 'PENDING', now() - interval '1 second', now(), now(), '{}'::json
FROM generate_series(1, 5000) AS i`, s.messages)); err != nil {
				t.Fatal(err)
			}
			if _, err := pg.Pool.Exec(ctx, "ANALYZE "+s.messages); err != nil {
				t.Fatal(err)
			}
			// Another processor holds 1,000 leases.
			for range 2 {
				if _, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "other", Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			explain := func(settings, sql string, args ...any) string {
				t.Helper()
				tx, err := pg.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if _, err := tx.Exec(ctx, settings); err != nil {
					t.Fatal(err)
				}
				rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
				if err != nil {
					t.Fatal(err)
				}
				var lines []string
				for rows.Next() {
					var l string
					if err := rows.Scan(&l); err != nil {
						t.Fatal(err)
					}
					lines = append(lines, l)
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				return strings.Join(lines, "\n")
			}
			claim := explain(planSettings, s.sql.claimAll, time.Now(), "p", 500, 2000, 100)
			if n := strings.Count(claim, "Tid Scan on "+s.prefix+"messages"); n < 2 {
				t.Errorf("claim: %d tuple-ID lookups, want the lock's and the update's:\n%s", n, claim)
			}
			ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()})
			if err != nil || len(ms) == 0 {
				t.Fatalf("claim: %d messages, %v", len(ms), err)
			}
			var ids, tids []string
			var att []int32
			var pm, resp []*string
			var started []*time.Time
			for _, m := range ms {
				tid, ok := s.tids.take(m.ID)
				if !ok {
					t.Fatalf("no tuple ID kept for %s", m.ID)
				}
				ids, tids, att = append(ids, m.ID), append(tids, tid), append(att, int32(m.Attempts)) //nolint:gosec // small
				pm, resp, started = append(pm, nil), append(resp, nil), append(started, nil)
			}
			args := []any{time.Now(), "p", "", ids, att, pm, resp, started, tids}
			if del {
				args = append(args, s.opts.DeleteSentTopics)
			}
			finish := explain(tidSettings, s.sql.finishTID[finishSent], args...)
			want := 1
			if del {
				want = 2 // the delete and the update of the other topics
			}
			if n := strings.Count(finish, "Tid Scan on "+s.prefix+"messages"); n != want {
				t.Errorf("outcome: %d tuple-ID lookups, want %d:\n%s", n, want, finish)
			}
			if strings.Contains(finish, "messages_processing") {
				t.Errorf("outcome scans the lease index:\n%s", finish)
			}
		})
	}
}
