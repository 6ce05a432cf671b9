package postgres_test

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestClaimTokenUpgrade: messages leased before migration 12 (claimed by a
// processor of an earlier version, so without a claim token) are finished
// by an outcome without a token, as that processor sends, and recovered by
// lease recovery; an outcome that names a token does not finish them.
// Messages claimed after the upgrade get a token, which their outcomes must
// carry.
func TestClaimTokenUpgrade(t *testing.T) {
	b := setup(t)
	if err := b.store.MigrateTo(b.ctx, 11); err != nil {
		t.Fatal(err)
	}
	en := b.enqueue(msg("t", "", 1), msg("t", "", 2), msg("t", "", 3), msg("t", "", 4))
	id := func(i int) string { return en[i].Message.ID }
	// The earlier version's claim of the first three.
	claimedAt := time.Now().Add(-time.Hour).UTC()
	if _, err := b.pg.Pool.Exec(b.ctx, "UPDATE "+b.store.MessagesTable()+
		" SET status = 'PROCESSING', attempts = attempts + 1, claimed_at = $1, claimed_by = 'old', updated_at = $1 WHERE id = ANY($2)",
		claimedAt, []string{id(0), id(1), id(2)}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: id(i)})
		if err != nil || m.Status != outbox.StatusProcessing || m.ClaimToken != "" {
			t.Fatalf("message %d after the upgrade: %+v, %v; want PROCESSING without a claim token", i, m, err)
		}
	}
	res, err := b.store.MessageFinish(b.ctx, outbox.MessageFinishParams{Owner: "old", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: "t", ID: id(0), Attempt: 1},
		{Kind: outbox.OutcomeSent, Topic: "t", ID: id(1), Attempt: 1, ClaimToken: outbox.NewClaimToken()},
	}})
	if err != nil || !slices.Equal(res.LeaseLost, []string{id(1)}) {
		t.Fatalf("outcomes for leases taken before the upgrade: %+v, %v; want the one without a token applied, the other lost", res, err)
	}
	rec, err := b.store.MessageRecover(b.ctx, outbox.MessageRecoverParams{ClaimedBefore: time.Now().Add(-time.Minute), Now: time.Now()})
	if err != nil || rec.Recovered != 2 {
		t.Fatalf("recovering the leases taken before the upgrade: %+v, %v; want 2 recovered", rec, err)
	}
	got := b.claim("new", 10)
	if len(got) != 3 {
		t.Fatalf("claimed %v after the upgrade, want 3", ids(got))
	}
	for _, m := range got {
		if m.ClaimToken == "" {
			t.Fatalf("message %s claimed after the upgrade has no claim token", m.ID)
		}
	}
	res, err = b.store.MessageFinish(b.ctx, outbox.MessageFinishParams{Owner: "new", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: "t", ID: got[0].ID, Attempt: got[0].Attempts},
	}})
	if err != nil || len(res.LeaseLost) != 1 {
		t.Fatalf("an outcome without a token for a lease with one: %+v, %v; want it lost", res, err)
	}
	b.sent("new", got...)
	if err := b.store.MigrateTo(b.ctx, 11); err != nil {
		t.Fatalf("migrating down past the claim token: %v", err)
	}
}
