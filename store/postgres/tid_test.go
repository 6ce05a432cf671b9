package postgres_test

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestOutcomeFindsMovedRows: outcomes find their rows by the tuple ID the
// claim returned; a row that moved since (a lease renewal, or any update
// the store did not make) is still finished, by message ID, and the lease
// fence holds on both paths: an outcome for a lease lost to recovery and
// claimed again is refused, whichever path looks for it.
func TestOutcomeFindsMovedRows(t *testing.T) {
	b := setup(t)
	b.enqueue(msg("t", "g", 1), msg("t", "g", 2), msg("t", "", 3), msg("t", "", 4), msg("t", "", 5))
	ms := b.claim("p", 5)
	if len(ms) != 5 {
		t.Fatalf("claimed %d, want 5", len(ms))
	}
	// ms[0]: renewed (moves; the renewal returns the new tuple ID).
	if _, err := b.store.MessageExtendLease(b.ctx, outbox.MessageExtendLeaseParams{Owner: "p", Now: time.Now(),
		Leases: []outbox.Lease{{ID: ms[0].ID, Attempt: 1}}}); err != nil {
		t.Fatal(err)
	}
	// ms[1], ms[2]: moved behind the store's back (its tuple IDs are stale).
	if _, err := b.pg.Pool.Exec(b.ctx, "UPDATE "+b.store.MessagesTable()+" SET updated_at = updated_at WHERE id = ANY($1)",
		[]string{ms[1].ID, ms[2].ID}); err != nil {
		t.Fatal(err)
	}
	// ms[3]: its lease expires, recovery takes it and another owner claims
	// it again (attempt 1 again: a recovery does not count the attempt).
	if _, err := b.pg.Pool.Exec(b.ctx, "UPDATE "+b.store.MessagesTable()+" SET claimed_at = claimed_at - interval '1 hour' WHERE id = $1", ms[3].ID); err != nil {
		t.Fatal(err)
	}
	if res, err := b.store.MessageRecover(b.ctx, outbox.MessageRecoverParams{ClaimedBefore: time.Now().Add(-time.Minute), Now: time.Now()}); err != nil || res.Recovered != 1 {
		t.Fatalf("recover: %+v, %v", res, err)
	}
	again := b.claim("q", 5)
	if len(again) != 1 || again[0].ID != ms[3].ID {
		t.Fatalf("q claimed %v, want only %s", ids(again), ms[3].ID)
	}
	p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
	for i, m := range ms {
		kind := outbox.OutcomeSent
		if i == 2 {
			kind = outbox.OutcomeReleased
		}
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: kind, ID: m.ID, Attempt: m.Attempts})
	}
	res, err := b.store.MessageFinish(b.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.LeaseLost, []string{ms[3].ID}) {
		t.Fatalf("lease lost %v, want only %s (recovered and claimed by q)", res.LeaseLost, ms[3].ID)
	}
	want := []outbox.Status{outbox.StatusSent, outbox.StatusSent, outbox.StatusPending, outbox.StatusProcessing, outbox.StatusSent}
	for i, m := range ms {
		got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{Tenant: m.Tenant, ID: m.ID})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != want[i] {
			t.Errorf("message %d: %s, want %s", i, got.Status, want[i])
		}
	}
	// q's outcome still applies (its tuple ID is current).
	b.sent("q", again...)
}
