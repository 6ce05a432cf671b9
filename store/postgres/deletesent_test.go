package postgres_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestDeleteSentTopics: with Options.DeleteSentTopics, a sent message of
// such a topic is deleted with its attempt history, under the same lease
// fence as an update; other topics, dead letters and retries are kept as
// usual, the group's next message is claimable once the head is gone, and
// the idempotency key is free again.
func TestDeleteSentTopics(t *testing.T) {
	for _, logMode := range []bool{false, true} {
		t.Run(fmt.Sprintf("logMode=%v", logMode), func(t *testing.T) {
			if _, err := postgres.New(nil, postgres.Options{}); err == nil {
				t.Fatal("New(nil) accepted")
			}
			if _, err := postgres.New(setup(t).pg.Pool, postgres.Options{DeleteSentTopics: []string{""}}); !errors.Is(err, outbox.ErrInvalidInput) {
				t.Fatalf("an empty topic: %v, want ErrInvalidInput", err)
			}
			b := setup(t, func(o *postgres.Options) { o.DeleteSentTopics = []string{"gone"} })
			if logMode {
				postgres.EnableLogMode(b.store)
			}
			first := msg("gone", "g", 1)
			first.IdempotencyKey = "k1"
			en := b.enqueue(first, msg("gone", "g", 2), msg("kept", "g", 3), msg("gone", "", 4), msg("gone", "", 5))
			id := func(i int) string { return en[i].Message.ID }
			ms := b.claim("p", 10)
			got := ids(ms)
			slices.Sort(got)
			want := []string{id(0), id(1), id(2), id(3), id(4)}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("claimed %v, want %v", got, want)
			}
			finish := func(owner string, outcomes ...outbox.Outcome) outbox.FinishResult {
				t.Helper()
				res, err := b.store.MessageFinish(b.ctx, outbox.MessageFinishParams{Owner: owner, Now: time.Now(), Outcomes: outcomes})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			token := make(map[string]string, len(ms))
			for _, m := range ms {
				token[m.ID] = m.ClaimToken
			}
			sent := func(i int) outbox.Outcome {
				return outbox.Outcome{Kind: outbox.OutcomeSent, ID: id(i), Attempt: 1, ClaimToken: token[id(i)]}
			}
			// Another owner's outcome deletes nothing.
			if res := finish("q", sent(0)); !slices.Equal(res.LeaseLost, []string{id(0)}) {
				t.Fatalf("q's outcome: lease lost %v, want %s", res.LeaseLost, id(0))
			}
			res := finish("p", sent(0), sent(1), sent(2),
				outbox.Outcome{Kind: outbox.OutcomeRetry, ID: id(3), Attempt: 1, ClaimToken: token[id(3)], Error: &outbox.ErrorInfo{Code: "busy"}, NextAttemptAt: time.Now().Add(-time.Second)},
				outbox.Outcome{Kind: outbox.OutcomeDead, ID: id(4), Attempt: 1, ClaimToken: token[id(4)], Error: &outbox.ErrorInfo{Code: "bad"}})
			if len(res.LeaseLost) > 0 {
				t.Fatalf("lease lost %v", res.LeaseLost)
			}
			status := func(i int) outbox.Status {
				t.Helper()
				m, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{Tenant: en[i].Message.Tenant, ID: id(i)})
				if errors.Is(err, outbox.ErrNotFound) {
					return "deleted"
				}
				if err != nil {
					t.Fatal(err)
				}
				return m.Status
			}
			for i, want := range []outbox.Status{"deleted", "deleted", outbox.StatusSent, outbox.StatusPending, outbox.StatusFailed} {
				if got := status(i); got != want {
					t.Errorf("message %d: %s, want %s", i, got, want)
				}
			}
			history := func(i int) int {
				t.Helper()
				var n int
				if err := b.pg.Pool.QueryRow(b.ctx, "SELECT count(*) FROM "+b.store.AttemptsTable()+" WHERE message_id = $1", id(i)).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := history(3); n != 1 {
				t.Fatalf("retried message: %d attempt rows, want 1", n)
			}
			// The retried message is sent at its second attempt: deleted with its
			// history.
			again := b.claim("p", 10)
			if len(again) != 1 || again[0].ID != id(3) || again[0].Attempts != 2 {
				t.Fatalf("claimed %v, want %s at attempt 2", ids(again), id(3))
			}
			finish("p", outbox.Outcome{Kind: outbox.OutcomeSent, ID: id(3), Attempt: 2, ClaimToken: again[0].ClaimToken})
			if got := status(3); got != "deleted" {
				t.Fatalf("retried message: %s after its send, want deleted", got)
			}
			if n := history(3); n != 0 {
				t.Fatalf("deleted message: %d attempt rows left", n)
			}
			if n := history(4); n != 1 {
				t.Fatalf("dead letter: %d attempt rows, want 1", n)
			}
			// The key of a deleted message is free again.
			re := msg("gone", "g", 6)
			re.IdempotencyKey = "k1"
			r := b.enqueue(re)
			if r[0].Existed || r[0].Message.ID == id(0) {
				t.Fatalf("re-enqueue with a deleted message's key: %+v, want a new message", r[0])
			}
			// Its group's deleted messages do not hold it.
			if last := b.claim("p", 10); len(last) != 1 || last[0].ID != r[0].Message.ID {
				t.Fatalf("claimed %v, want the new message %s", ids(last), r[0].Message.ID)
			}
		})
	}
}
