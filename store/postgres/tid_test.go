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
		Leases: []outbox.Lease{{ID: ms[0].ID, Attempt: 1, ClaimToken: ms[0].ClaimToken}}}); err != nil {
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
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: kind, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
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

// TestOutcomeRetryAfterSecondStatementFails: when the outcomes written by
// tuple ID are committed and the statement for the moved rows then fails,
// the caller's retry of the whole batch hears that the first ones were
// written (its observers report them sent), not that their leases were
// lost; and an outcome remembered so is forgotten once the store leases
// the message again.
func TestOutcomeRetryAfterSecondStatementFails(t *testing.T) {
	b := setup(t)
	b.enqueue(msg("t", "", 1), msg("t", "", 2))
	ms := b.claim("p", 2)
	if len(ms) != 2 {
		t.Fatalf("claimed %d, want 2", len(ms))
	}
	tbl := b.store.MessagesTable()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := b.pg.Pool.Exec(b.ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE FUNCTION ` + b.pg.Name + `.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused by the test'; END $$`)
	// failSecond finishes ms with outcomes of kind after moving ms[1]
	// behind the store's back (its outcome goes by message ID, in the
	// second statement) and making any change of its leased row fail, and
	// returns the params.
	failSecond := func(kind outbox.OutcomeKind, ms []outbox.Message) outbox.MessageFinishParams {
		t.Helper()
		exec("UPDATE "+tbl+" SET updated_at = updated_at WHERE id = $1", ms[1].ID)
		exec(`CREATE TRIGGER refuse BEFORE UPDATE ON ` + tbl + ` FOR EACH ROW WHEN (NEW.id = '` + ms[1].ID +
			`' AND OLD.status = 'PROCESSING') EXECUTE FUNCTION ` + b.pg.Name + `.refuse()`)
		p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: kind, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		if _, err := b.store.MessageFinish(b.ctx, p); err == nil {
			t.Fatal("the finish succeeded through the refusing trigger")
		}
		exec("DROP TRIGGER refuse ON " + tbl)
		return p
	}
	p := failSecond(outbox.OutcomeSent, ms)
	if got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: ms[0].ID}); err != nil || got.Status != outbox.StatusSent {
		t.Fatalf("the outcome written by tuple ID: %v, %v; want it committed (SENT)", got.Status, err)
	}
	res, err := b.store.MessageFinish(b.ctx, p)
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("retry: lease lost %v, %v; want both applied", res.LeaseLost, err)
	}
	for _, m := range ms {
		if got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: m.ID}); err != nil || got.Status != outbox.StatusSent {
			t.Fatalf("%s: %v, %v; want SENT", m.ID, got.Status, err)
		}
	}
	// A remembered outcome does not outlive a new lease of its message: a
	// release (which gives the attempt back) is remembered by a failed
	// call, the message is claimed again with the same attempt number: the
	// remembered release is neither reported applied nor written (its claim
	// token is the earlier lease's), and a release of the new lease is
	// written.
	b.enqueue(msg("t", "", 3), msg("t", "", 4))
	more := b.claim("p", 2)
	if len(more) != 2 {
		t.Fatalf("claimed %d, want 2", len(more))
	}
	release := failSecond(outbox.OutcomeReleased, more)
	again := b.claim("p", 1)
	if len(again) != 1 || again[0].ID != more[0].ID || again[0].Attempts != more[0].Attempts {
		t.Fatalf("claimed again %+v, want %s at attempt %d", again, more[0].ID, more[0].Attempts)
	}
	res, err = b.store.MessageFinish(b.ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: release.Outcomes[:1]})
	if err != nil || len(res.LeaseLost) != 1 {
		t.Fatalf("the earlier lease's release, retried: lost %v, %v; want it lost", res.LeaseLost, err)
	}
	if got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: more[0].ID}); err != nil || got.Status != outbox.StatusProcessing {
		t.Fatalf("after the earlier lease's release: %v, %v; want PROCESSING (the new lease)", got.Status, err)
	}
	rel := release.Outcomes[0]
	rel.ClaimToken = again[0].ClaimToken
	res, err = b.store.MessageFinish(b.ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: []outbox.Outcome{rel}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("release of the new lease: lost %v, %v", res.LeaseLost, err)
	}
	if got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: more[0].ID}); err != nil || got.Status != outbox.StatusPending {
		t.Fatalf("released again: %v, %v; want PENDING (the new lease's release written)", got.Status, err)
	}
}
