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
}
