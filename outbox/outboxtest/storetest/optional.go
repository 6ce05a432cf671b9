package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

// ListerTx is the optional capability CapListInTx: listing messages in the
// caller's transaction, seeing its uncommitted writes.
type ListerTx[TTx any] interface {
	MessageListTx(ctx context.Context, tx TTx, p outbox.MessageListParams) (outbox.MessagePage, error)
}

func testOptional[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("Wakeups", func(t *testing.T) {
		need(t, h, CapWakeups)
		e := setup(t, h)
		w, ok := e.s.(outbox.Waker)
		if !ok {
			t.Fatalf("the Store does not implement outbox.Waker; declare Features.Lacks %q", CapWakeups)
		}
		ctx, cancel := context.WithCancel(e.ctx)
		defer cancel()
		ch := w.Wakeups(ctx)
		// Let start-up settle: a store may wake once when its listener is
		// ready.
		for quiet := false; !quiet; {
			select {
			case _, open := <-ch:
				if !open {
					t.Fatal("the wake-up channel closed before its context ended")
				}
			case <-time.After(300 * time.Millisecond):
				quiet = true
			}
		}
		e.enqueue(msg("t", "", 1))
		select {
		case _, open := <-ch:
			if !open {
				t.Fatal("the wake-up channel closed before its context ended")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no wake-up within 10 s of a committed enqueue")
		}
		cancel()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case _, open := <-ch:
				if !open {
					return
				}
			case <-deadline:
				t.Fatal("the wake-up channel was not closed after its context ended")
			}
		}
	})

	t.Run("ListInTx", func(t *testing.T) {
		need(t, h, CapListInTx)
		e := setup(t, h)
		l, ok := e.s.(ListerTx[TTx])
		if !ok {
			if l, ok = any(e.b.Enqueuer).(ListerTx[TTx]); !ok {
				t.Fatalf("neither the Store nor the Enqueuer has MessageListTx; declare Features.Lacks %q", CapListInTx)
			}
		}
		before := e.enqueue(msg("t", "", 1))[0]
		tx := e.begin()
		res, err := e.ob.EnqueueTx(e.ctx, tx, msg("t", "", 2))
		require.NoError(t, err, "EnqueueTx")
		page, err := l.MessageListTx(e.ctx, tx, outbox.MessageListParams{})
		require.NoError(t, err, "MessageListTx")
		wantIDs(t, "MessageListTx in the transaction", page.Messages, before, res[0].Message)
		e.usable(tx)
		e.commit(tx)
		wantIDs(t, "MessageList after the commit", e.list(outbox.MessageListParams{}).Messages, before, res[0].Message)
	})

	// A store that implements outbox.OrphanRecoverer (a probe: the
	// capability is optional and not declared) gives every lease back,
	// however recent: the same owner's next claim at the same attempt
	// takes the messages in group order, and the late outcome of the
	// first claims is refused, only their claim tokens telling them
	// apart.
	t.Run("RecoverOrphans", func(t *testing.T) {
		e := setup(t, h)
		r, ok := e.s.(outbox.OrphanRecoverer)
		if !ok {
			t.Skip("the Store does not implement outbox.OrphanRecoverer")
		}
		g := e.enqueueN("t", "g", 3)
		first := e.claim("a", 2, e.at(time.Second))
		wantIDs(t, "the first claim", first, g[0], g[1])
		res, err := r.MessageRecoverOrphans(e.ctx, outbox.MessageRecoverOrphansParams{Now: e.at(2 * time.Second)})
		require.NoError(t, err, "MessageRecoverOrphans")
		require.Equal(t, outbox.RecoverResult{Recovered: 2}, res, "MessageRecoverOrphans")
		again := e.claim("a", 10, e.at(3*time.Second))
		wantIDs(t, "the claim after the recovery", again, g[0], g[1], g[2])
		require.Equal(t, first[0].Attempts, again[0].Attempts, "the attempt lost to the recovery is not counted")
		p := outbox.MessageFinishParams{Owner: "a", Now: e.at(4 * time.Second)}
		for _, m := range first {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "late-" + m.ID, StartedAt: p.Now})
		}
		require.ElementsMatch(t, ids(first), e.finish(p).LeaseLost, "the late outcome of the recovered claims")
		e.sent("a", e.at(5*time.Second), again...)
		require.Equal(t, "prov-"+g[0].ID, e.get("", g[0].ID).ProviderMessageID, "the outcome recorded")
	})
}
