package postgres

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestClaimFairShareBetweenTenants: tenant a has 100,000 messages waiting
// (1,000 groups), then tenant b enqueues one. b's message is claimed within
// the first claims, not after a's backlog (200 claims of 500), and every
// claim stays within its limit and in sequence order.
func TestClaimFairShareBetweenTenants(t *testing.T) {
	for _, logMode := range []bool{false, true} {
		t.Run(fmt.Sprintf("logMode=%v", logMode), func(t *testing.T) {
			s, pg, ctx := migratedStore(t, Options{})
			if logMode {
				s.enableLogMode()
			}
			const n = 100_000
			if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.messages+` (id, tenant, topic, grp, idempotency_key, status,
			next_attempt_at, created_at, updated_at, payload)
		SELECT 'm' || i, 'a', 't', 'g' || (i % 1000), 'm' || i, 'PENDING', now() - interval '1 second', now(), now(), '{}'::json
		FROM generate_series(1, $1::int) AS i`, n); err != nil {
				t.Fatal(err)
			}
			if logMode {
				// The enqueue registers groups; this test inserts a's rows itself.
				if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.groupsTable()+` SELECT DISTINCT tenant, topic, grp FROM `+s.messages); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := pg.Pool.Exec(ctx, `ANALYZE `+s.messages); err != nil {
				t.Fatal(err)
			}
			ob := outbox.New[pgx.Tx](s, outbox.Options{})
			res, err := ob.Enqueue(ctx, outbox.Message{Tenant: "b", Topic: "t", Group: "g0", Payload: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			b := res[0].Message.ID
			for claims := 1; claims <= 3; claims++ {
				ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now(), Topics: []string{"t"}})
				if err != nil {
					t.Fatal(err)
				}
				if len(ms) == 0 || len(ms) > 500 {
					t.Fatalf("claim %d: %d messages, want 1 to 500", claims, len(ms))
				}
				found := false
				p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
				for i, m := range ms {
					if i > 0 && ms[i-1].Seq >= m.Seq {
						t.Fatalf("claim %d: out of sequence order at %d", claims, i)
					}
					found = found || m.ID == b
					p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
				}
				if found {
					t.Logf("b's message claimed by claim %d", claims)
					return
				}
				if _, err := s.MessageFinish(ctx, p); err != nil {
					t.Fatal(err)
				}
				time.Sleep(fairEvery)
			}
			t.Fatal("b's message was not claimed in 3 claims: it waits behind a's backlog")
		})
	}
}
