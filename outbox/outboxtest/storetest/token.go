package storetest

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TokenStore is what LeaseWithoutClaimToken needs of a store.
type TokenStore[TTx any] interface {
	outbox.Store
	outbox.Enqueuer[TTx]
	outbox.LeaseExtender
}

// LeaseWithoutClaimToken checks a store that added claim tokens in a
// migration against the leases taken before it: a message leased without
// a claim token is extended by a lease without a token and finished by an
// outcome without one, as the processor that claimed it sends them; a lease
// or an outcome naming a token does not match it; lease recovery recovers
// it. st is a fresh, migrated store; dropTokens removes the claim token of
// every message in st's database, as a claim of an earlier version left
// them.
func LeaseWithoutClaimToken[TTx any](t *testing.T, st TokenStore[TTx], dropTokens func(ctx context.Context) error) {
	t.Helper()
	ctx := context.Background()
	ob := outbox.New[TTx](st, outbox.Options{})
	var msgs []outbox.Message
	for range 3 {
		msgs = append(msgs, outbox.Message{Topic: "t", Payload: json.RawMessage(`{}`)})
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 3, Owner: "old", Now: now})
	if err != nil || len(c) != 3 {
		t.Fatalf("claim: %d, %v", len(c), err)
	}
	if err := dropTokens(ctx); err != nil {
		t.Fatal(err)
	}
	ext, err := st.MessageExtendLease(ctx, outbox.MessageExtendLeaseParams{Owner: "old", Now: now.Add(time.Hour), Leases: []outbox.Lease{
		{Topic: "t", ID: c[0].ID, Attempt: 1}, {Topic: "t", ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken},
	}})
	if err != nil || !slices.Equal(ext.LeaseLost, []string{c[1].ID}) {
		t.Fatalf("extending leases without a token: %+v, %v; want the one naming a token lost", ext, err)
	}
	res, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "old", Now: now, Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: "t", ID: c[0].ID, Attempt: 1},
		{Kind: outbox.OutcomeSent, Topic: "t", ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken},
	}})
	if err != nil || !slices.Equal(res.LeaseLost, []string{c[1].ID}) {
		t.Fatalf("outcomes for leases without a token: %+v, %v; want the one naming a token lost", res, err)
	}
	rec, err := st.MessageRecover(ctx, outbox.MessageRecoverParams{ClaimedBefore: now.Add(30 * time.Minute), Now: now.Add(time.Hour)})
	if err != nil || rec.Recovered != 2 {
		t.Fatalf("recovering leases without a token: %+v, %v; want 2", rec, err)
	}
	if m, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: c[0].ID}); err != nil || m.Status != outbox.StatusSent {
		t.Fatalf("the message finished without a token: %+v, %v; want SENT", m.Status, err)
	}
}
