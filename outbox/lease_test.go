package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// stallingStore is the real store whose MessageFinish waits until gate is
// closed: a store that stalls while outcomes are written.
type stallingStore struct {
	*sqlite.Store
	gate    chan struct{}
	stalled chan struct{} // closed when the first MessageFinish waits
	once    sync.Once
}

func (s *stallingStore) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	s.once.Do(func() { close(s.stalled) })
	<-s.gate
	return s.Store.MessageFinish(ctx, p)
}

func TestProcessorBoundsUnrecordedOutcomes(t *testing.T) {
	t.Parallel()
	st := &stallingStore{Store: newStore(t), gate: make(chan struct{}), stalled: make(chan struct{})}
	enqueue(t, st.Store, 500, func(int) string { return "" })
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		published.Add(int64(len(msgs)))
		return make([]outbox.Result, len(msgs))
	})
	const batch, groups, unrecorded = 10, 2, 10
	p, err := outbox.NewProcessor(st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: 5 * time.Millisecond,
		PublishBatchSize: batch, MaxConcurrentGroups: groups, MaxUnrecordedOutcomes: unrecorded})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, p)
	unstall := sync.OnceFunc(func() { close(st.gate) })
	t.Cleanup(unstall) // before stop's cleanup: a failed test must not leave Run blocked
	select {
	case <-st.stalled:
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome was written within 30 s")
	}
	// The store is stalled: the workers must stop publishing once
	// MaxUnrecordedOutcomes outcomes wait (plus what was being published
	// when they started), not publish the whole claim of 500.
	time.Sleep(300 * time.Millisecond)
	if n := published.Load(); n > unrecorded+groups*batch {
		t.Fatalf("%d messages published while their outcomes could not be written; the bound is %d + %d batches of %d",
			n, unrecorded, groups, batch)
	}
	unstall()
	c := outboxtest.WaitDrained(t, st, "", time.Minute)
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	if c[outbox.StatusSent] != 500 || published.Load() != 500 {
		t.Fatalf("counts %v, %d published; want 500 sent, each published once", c, published.Load())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestProcessorWarnsWhenTheStoreCannotExtendLeases(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	for _, tc := range []struct {
		name  string
		store outbox.Store
		warn  bool
	}{
		{"lease extender", st, false},
		{"no lease extension", struct{ outbox.Store }{st}, true},
	} {
		var logs syncBuffer
		p, err := outbox.NewProcessor(tc.store, &outboxtest.Recorder{}, outbox.Config{Topics: []string{"t"},
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, p)
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), "processor started"); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the processor did not start within 30 s; logs:\n%s", tc.name, logs.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err, _ := stop(); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "cannot extend leases"); got != tc.warn {
			t.Fatalf("%s: warned %v, want %v; logs:\n%s", tc.name, got, tc.warn, logs.String())
		}
	}
}
