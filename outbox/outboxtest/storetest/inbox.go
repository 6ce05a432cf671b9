package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

// The handler of the inbox tests has one effect, written in the caller's
// transaction: it enqueues a message of topic effectTopic (tenant "") naming
// the consumer, tenant and message it handled. Counting those messages
// counts the handler's committed effects.
const effectTopic = "inbox.effect"

// inboxEnv is an env with the backend's inbox store.
type inboxEnv[TTx any] struct {
	*env[TTx]
	store outbox.InboxStore[TTx]
	inbox *outbox.Inbox[TTx]
}

func setupInbox[TTx any](t *testing.T, h Harness[TTx]) *inboxEnv[TTx] {
	t.Helper()
	e := setup(t, h)
	if e.b.Inbox == nil {
		t.Fatalf("storetest: the Backend has no Inbox; declare Features.Lacks %q", CapInbox)
	}
	return &inboxEnv[TTx]{env: e, store: e.b.Inbox, inbox: outbox.NewInbox[TTx](e.b.Inbox)}
}

var errHandler = errors.New("storetest: handler failed")

// handle runs Inbox.HandleTx in tx with the effect handler; fail is what the
// handler returns after its effect. It reports whether the handler ran and
// the error of HandleTx, after checking that HandleTx reports exactly when
// the handler ran.
func (e *inboxEnv[TTx]) handle(ctx context.Context, tx TTx, consumer, tenant, id string, fail error) (bool, error) {
	ran := false
	got, err := e.inbox.HandleTx(ctx, tx, consumer, tenant, id, func(ctx context.Context) error {
		ran = true
		payload := fmt.Sprintf(`{"consumer":%q,"tenant":%q,"id":%q}`, consumer, tenant, id)
		if _, err := e.ob.EnqueueTx(ctx, tx, outbox.Message{Topic: effectTopic, Payload: []byte(payload)}); err != nil {
			return err
		}
		return fail
	})
	if got != ran {
		return ran, fmt.Errorf("HandleTx reported ran=%v, the handler ran=%v (err %v)", got, ran, err)
	}
	return ran, err
}

// handleIn runs one delivery in a transaction of its own and commits it
// (rolls it back when the handler fails). It returns whether the handler
// ran.
func (e *inboxEnv[TTx]) handleIn(consumer, tenant, id string) bool {
	e.t.Helper()
	tx := e.begin()
	ran, err := e.handle(e.ctx, tx, consumer, tenant, id, nil)
	if err != nil {
		_ = e.b.Rollback(e.ctx, tx)
		e.t.Fatalf("HandleTx(%q, %q, %q): %v", consumer, tenant, id, err)
	}
	e.commit(tx)
	return ran
}

// effects returns the payloads of the committed effects.
func (e *inboxEnv[TTx]) effects() []string {
	e.t.Helper()
	page, err := e.s.MessageList(e.ctx, outbox.MessageListParams{Topic: effectTopic, Limit: 1000})
	require.NoError(e.t, err, "MessageList")
	out := make([]string, len(page.Messages))
	for i, m := range page.Messages {
		out[i] = string(m.Payload)
	}
	return out
}

func (e *inboxEnv[TTx]) wantEffects(n int) {
	e.t.Helper()
	if got := e.effects(); len(got) != n {
		e.t.Fatalf("%d committed handler effects, want %d: %s", len(got), n, strings.Join(got, " "))
	}
}

// claimAt records a delivery directly with the store at time now, in a
// transaction of its own, and returns what the store returned.
func (e *inboxEnv[TTx]) claimAt(consumer, tenant, id string, now time.Time) bool {
	e.t.Helper()
	tx := e.begin()
	first, err := e.store.InboxClaimTx(e.ctx, tx, outbox.InboxClaimParams{Consumer: consumer, Tenant: tenant, MessageID: id, Now: now})
	if err != nil {
		_ = e.b.Rollback(e.ctx, tx)
		e.t.Fatalf("InboxClaimTx(%q, %q, %q): %v", consumer, tenant, id, err)
	}
	e.commit(tx)
	return first
}

func testInbox[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("FirstDeliveryThenRedelivery", func(t *testing.T) {
		need(t, h, CapInbox)
		e := setupInbox(t, h)
		if !e.handleIn("billing", "", "m1") {
			t.Fatal("the first delivery did not run the handler")
		}
		e.wantEffects(1)
		for i := range 3 {
			if e.handleIn("billing", "", "m1") {
				t.Fatalf("redelivery %d after the commit ran the handler again", i+1)
			}
		}
		e.wantEffects(1)
		// Another message of the same consumer is new.
		if !e.handleIn("billing", "", "m2") {
			t.Fatal("another message did not run the handler")
		}
		e.wantEffects(2)
	})

	t.Run("SameTransaction", func(t *testing.T) {
		need(t, h, CapInbox)
		e := setupInbox(t, h)
		tx := e.begin()
		p := outbox.InboxClaimParams{Consumer: "billing", MessageID: "m1", Now: e.t0}
		for i, want := range []bool{true, false, false} {
			first, err := e.store.InboxClaimTx(e.ctx, tx, p)
			if err != nil || first != want {
				t.Fatalf("claim %d in one transaction: %v, %v; want %v", i+1, first, err, want)
			}
		}
		e.usable(tx)
		e.commit(tx)
		if e.claimAt("billing", "", "m1", e.t0) {
			t.Fatal("the claim after the commit was first")
		}
	})

	t.Run("HandlerErrorRollsBack", func(t *testing.T) {
		need(t, h, CapInbox, CapTransactions)
		e := setupInbox(t, h)
		tx := e.begin()
		ran, err := e.handle(e.ctx, tx, "billing", "", "m1", errHandler)
		if !ran || !errors.Is(err, errHandler) {
			t.Fatalf("failing handler: ran %v, err %v; want it run and its error returned", ran, err)
		}
		require.NoError(t, e.b.Rollback(e.ctx, tx), "Rollback")
		e.wantEffects(0)
		// The rolled-back transaction left no record: the redelivery runs.
		if !e.handleIn("billing", "", "m1") {
			t.Fatal("the redelivery after a rollback did not run the handler")
		}
		e.wantEffects(1)
		if e.handleIn("billing", "", "m1") {
			t.Fatal("the redelivery after the commit ran the handler")
		}
		e.wantEffects(1)
	})

	t.Run("ConsumersAndTenantsAreSeparate", func(t *testing.T) {
		need(t, h, CapInbox)
		e := setupInbox(t, h)
		keys := []struct{ consumer, tenant string }{
			{"billing", ""}, {"shipping", ""}, {"billing", "a"}, {"billing", "b"}, {"shipping", "a"},
		}
		for _, k := range keys {
			if !e.handleIn(k.consumer, k.tenant, "m1") {
				t.Fatalf("consumer %q tenant %q: the first delivery did not run the handler", k.consumer, k.tenant)
			}
		}
		e.wantEffects(len(keys))
		for _, k := range keys {
			if e.handleIn(k.consumer, k.tenant, "m1") {
				t.Fatalf("consumer %q tenant %q: the redelivery ran the handler", k.consumer, k.tenant)
			}
		}
		e.wantEffects(len(keys))
		// Keys compare exactly: a case or a trailing space makes another key.
		for _, id := range []string{"M1", "m1 "} {
			if !e.handleIn("billing", "", id) {
				t.Fatalf("message %q was taken for m1", id)
			}
		}
		if !e.handleIn("Billing", "", "m1") {
			t.Fatal("consumer Billing was taken for billing")
		}
		e.wantEffects(len(keys) + 3)
	})

	// Two transactions deliver the same message at once: the second waits
	// for the first, and exactly one handler effect is committed.
	for _, firstCommits := range []bool{true, false} {
		name := "ConcurrentFirstCommits"
		if !firstCommits {
			name = "ConcurrentFirstRollsBack"
		}
		t.Run(name, func(t *testing.T) {
			need(t, h, CapInbox, CapTransactions, CapLockWait)
			e := setupInbox(t, h)
			tx1 := e.begin()
			if ran, err := e.handle(e.ctx, tx1, "billing", "t", "m1", nil); !ran || err != nil {
				_ = e.b.Rollback(e.ctx, tx1)
				t.Fatalf("first transaction: ran %v, err %v", ran, err)
			}
			type result struct {
				ran bool
				err error
			}
			done := make(chan result, 1)
			go func() {
				tx2, err := e.b.Begin(e.ctx)
				if err != nil {
					done <- result{err: fmt.Errorf("begin: %w", err)}
					return
				}
				ran, err := e.handle(e.ctx, tx2, "billing", "t", "m1", nil)
				if err != nil {
					_ = e.b.Rollback(e.ctx, tx2)
					done <- result{ran, err}
					return
				}
				done <- result{ran, e.b.Commit(e.ctx, tx2)}
			}()
			select {
			case r := <-done:
				_ = e.b.Rollback(e.ctx, tx1)
				t.Fatalf("the second transaction did not wait for the first: ran %v, err %v", r.ran, r.err)
			case <-time.After(200 * time.Millisecond):
			}
			if firstCommits {
				e.commit(tx1)
			} else if err := e.b.Rollback(e.ctx, tx1); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
			var r result
			select {
			case r = <-done:
			case <-e.ctx.Done():
				t.Fatal("the second transaction never ended")
			}
			if r.err != nil {
				t.Fatalf("second transaction: %v", r.err)
			}
			if r.ran == firstCommits {
				t.Fatalf("second transaction ran the handler: %v; want %v (the first committed: %v)", r.ran, !firstCommits, firstCommits)
			}
			e.wantEffects(1)
			if e.handleIn("billing", "t", "m1") {
				t.Fatal("a later redelivery ran the handler")
			}
			e.wantEffects(1)
		})
	}

	t.Run("Prune", func(t *testing.T) {
		need(t, h, CapInbox)
		e := setupInbox(t, h)
		old, cut := e.at(-3*time.Hour), e.at(-time.Hour)
		for i := range 5 {
			if !e.claimAt("billing", "", fmt.Sprintf("old%d", i), old.Add(time.Duration(i)*time.Second)) {
				t.Fatalf("claim old%d was not first", i)
			}
		}
		// Exactly at the cut is not older than it.
		if !e.claimAt("billing", "", "atcut", cut) || !e.claimAt("billing", "a", "new", e.t0) || !e.claimAt("shipping", "", "new", e.t0) {
			t.Fatal("a claim was not first")
		}
		if _, err := e.store.InboxPrune(e.ctx, outbox.InboxPruneParams{}); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Fatalf("InboxPrune without Before: %v; want an invalid input error", err)
		}
		for i, want := range []int{2, 2, 1, 0} {
			n, err := e.store.InboxPrune(e.ctx, outbox.InboxPruneParams{Before: cut, Limit: 2})
			if err != nil || n != want {
				t.Fatalf("InboxPrune %d (limit 2): %d, %v; want %d", i+1, n, err, want)
			}
		}
		// The pruned records are forgotten; the others are still recognised.
		for i := range 5 {
			if !e.claimAt("billing", "", fmt.Sprintf("old%d", i), e.t0) {
				t.Fatalf("old%d is still recorded after the prune", i)
			}
		}
		for _, k := range [][3]string{{"billing", "", "atcut"}, {"billing", "a", "new"}, {"shipping", "", "new"}} {
			if e.claimAt(k[0], k[1], k[2], e.t0) {
				t.Fatalf("%v was pruned", k)
			}
		}
		// The default limit removes everything older in one call.
		n, err := e.store.InboxPrune(e.ctx, outbox.InboxPruneParams{Before: e.at(time.Second)})
		if err != nil || n != 8 {
			t.Fatalf("InboxPrune with the default limit: %d, %v; want 8", n, err)
		}
	})

	t.Run("InvalidParamsKeepTheTransaction", func(t *testing.T) {
		need(t, h, CapInbox)
		e := setupInbox(t, h)
		tx := e.begin()
		long := strings.Repeat("x", outbox.MaxKeyLength+1)
		for _, p := range []outbox.InboxClaimParams{
			{MessageID: "m1"},
			{Consumer: "billing"},
			{Consumer: long, MessageID: "m1"},
			{Consumer: "billing", Tenant: long, MessageID: "m1"},
			{Consumer: "billing", MessageID: long},
		} {
			p.Now = e.t0
			first, err := e.store.InboxClaimTx(e.ctx, tx, p)
			var ve *outbox.ValidationError
			if first || !errors.As(err, &ve) || !errors.Is(err, outbox.ErrInvalidInput) {
				t.Fatalf("InboxClaimTx(%.40q, %.40q, %.40q): %v, %v; want a *outbox.ValidationError", p.Consumer, p.Tenant, p.MessageID, first, err)
			}
			e.usable(tx)
		}
		for _, k := range [][2]string{{"", "m1"}, {"billing", ""}} {
			ran, err := e.handle(e.ctx, tx, k[0], "", k[1], nil)
			if ran || !errors.Is(err, outbox.ErrInvalidInput) {
				t.Fatalf("HandleTx(%q, %q): ran %v, err %v; want an invalid input error", k[0], k[1], ran, err)
			}
			e.usable(tx)
		}
		// The transaction still works, for the inbox too.
		if ran, err := e.handle(e.ctx, tx, "billing", "", "m1", nil); !ran || err != nil {
			t.Fatalf("HandleTx after the invalid calls: ran %v, err %v", ran, err)
		}
		e.commit(tx)
		e.wantEffects(1)
		if e.handleIn("billing", "", "m1") {
			t.Fatal("the redelivery ran the handler")
		}
	})
}
