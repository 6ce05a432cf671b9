package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// claimedPerGroup counts claimed messages by group.
func claimedPerGroup(ms []outbox.Message) map[string]int {
	n := map[string]int{}
	for _, m := range ms {
		n[m.Group]++
	}
	return n
}

// TestClaimPerGroup: groups a, b and c hold 20 messages each, a's enqueued
// first, so in Seq order a claim of 12 would take a's first 12. With
// ClaimPerGroup 4 it takes 4 of each. Once a is held by that claim (its
// head is PROCESSING) and b's and c's messages are released, only b and c
// are claimable: a claim of 30 extends their runs past 4, the oldest
// group's first, to fill its limit.
func TestClaimPerGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mongo.Options{ClaimPerGroup: 4})
	var msgs []outbox.Message
	for _, g := range []string{"a", "b", "c"} {
		for i := range 20 {
			msgs = append(msgs, outbox.Message{Topic: "t", Group: g, Payload: []byte(fmt.Sprint(i))})
		}
	}
	if _, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	got, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 12, Owner: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if n := claimedPerGroup(got); len(got) != 12 || n["a"] != 4 || n["b"] != 4 || n["c"] != 4 {
		t.Fatalf("claim of 12 over 3 groups: %v, want 4 of each", n)
	}
	var rel []outbox.Outcome
	for _, m := range got {
		if m.Group != "a" {
			rel = append(rel, outbox.Outcome{Kind: outbox.OutcomeReleased, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
	}
	if res, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Outcomes: rel}); err != nil || len(res.LeaseLost) > 0 {
		t.Fatalf("release: %v, %d leases lost", err, len(res.LeaseLost))
	}
	got, err = st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 30, Owner: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if n := claimedPerGroup(got); len(got) != 30 || n["a"] != 0 || n["b"] != 20 || n["c"] != 10 {
		t.Fatalf("claim of 30 with a held: %v, want 20 of b and 10 of c", n)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Group == got[i-1].Group && got[i].Seq <= got[i-1].Seq {
			t.Fatalf("claim out of Seq order at %d: %d after %d", i, got[i].Seq, got[i-1].Seq)
		}
	}
}

// TestClaimPerGroupDefault: without the option a claim takes at most
// DefaultClaimPerGroup messages of a group while other groups fill it.
func TestClaimPerGroupDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mongo.Options{})
	var msgs []outbox.Message
	for _, g := range []string{"a", "b", "c", "d", "e"} {
		for range 2 * mongo.DefaultClaimPerGroup {
			msgs = append(msgs, outbox.Message{Topic: "t", Group: g, Payload: []byte(`{}`)})
		}
	}
	if _, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	got, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 5 * mongo.DefaultClaimPerGroup, Owner: "p"})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"a", "b", "c", "d", "e"} {
		if n := claimedPerGroup(got)[g]; n != mongo.DefaultClaimPerGroup {
			t.Fatalf("group %s: %d claimed, want %d (%v)", g, n, mongo.DefaultClaimPerGroup, claimedPerGroup(got))
		}
	}
}

// TestOptionNames: TablePrefix names the collections; CollectionPrefix,
// its former name, still does, and the two must agree when both are set; a
// negative ClaimPerGroup is refused.
func TestOptionNames(t *testing.T) {
	t.Parallel()
	db := testbackend.Mongo(t)
	for _, o := range []mongo.Options{{TablePrefix: "ob_"}, {CollectionPrefix: "ob_"}, {TablePrefix: "ob_", CollectionPrefix: "ob_"}} {
		s, err := mongo.New(db.DB, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		if name := s.Messages().Name(); name != "ob_messages" {
			t.Fatalf("%+v: messages collection %q, want ob_messages", o, name)
		}
	}
	if s, err := mongo.New(db.DB, mongo.Options{}); err != nil || s.Messages().Name() != mongo.DefaultTablePrefix+"messages" {
		t.Fatalf("default prefix: %v", err)
	}
	for _, o := range []mongo.Options{{TablePrefix: "a_", CollectionPrefix: "b_"}, {ClaimPerGroup: -1}, {TablePrefix: "a-b"}} {
		if _, err := mongo.New(db.DB, o); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Fatalf("%+v: New returned %v, want an error wrapping ErrInvalidInput", o, err)
		}
	}
}
