package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// The processor's own behaviour (backpressure, concurrency limit, drain,
// misbehaving publishers, wake-ups, recovery) against the real embedded
// store. FIFO and no-loss across several processors are in the conformance
// suite (outbox/outboxtest/storetest), run by every store.

func newStore(t *testing.T) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

func enqueue(t *testing.T, st *sqlite.Store, n int, group func(i int) string) []string {
	t.Helper()
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t", Group: group(i), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	res, err := ob.Enqueue(context.Background(), msgs...)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i, r := range res {
		ids[i] = r.Message.ID
	}
	return ids
}

// start runs p in the background; the returned stop cancels it and returns
// Run's error and how long the shutdown took.
func start(t *testing.T, p *outbox.Processor) (stop func() (error, time.Duration)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var err error
	var took time.Duration
	stop = func() (error, time.Duration) {
		once.Do(func() {
			t0 := time.Now()
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return 30s after cancel")
			}
			took = time.Since(t0)
		})
		return err, took
	}
	t.Cleanup(func() { stop() })
	return stop
}

func counts(t *testing.T, st outbox.Store) map[outbox.Status]int64 {
	t.Helper()
	c, err := st.MessageCount(context.Background(), outbox.MessageCountParams{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestProcessorBoundedBufferAndConcurrencyLimit(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	enqueue(t, st, 600, func(i int) string { return fmt.Sprintf("g%d", i%60) })

	var active, maxActive atomic.Int64
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []outbox.Result {
		n := active.Add(1)
		for {
			m := maxActive.Load()
			if n <= m || maxActive.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		active.Add(-1)
		return make([]outbox.Result, len(msgs))
	})
	const buffer, groups = 50, 3
	p, err := outbox.NewProcessor(st, pub, outbox.Config{
		Topics:       []string{"t"},
		PollInterval: 5 * time.Millisecond, BufferSize: buffer, PollBatchSize: 40, MaxConcurrentGroups: groups, PublishBatchSize: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, p)
	// While it works, the store never holds more PROCESSING messages than
	// the buffer: the rest waits in the database.
	deadline := time.Now().Add(60 * time.Second)
	for {
		c := counts(t, st)
		if c[outbox.StatusProcessing] > buffer {
			t.Fatalf("%d messages PROCESSING, buffer is %d", c[outbox.StatusProcessing], buffer)
		}
		if c[outbox.StatusSent] == 600 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %v", c)
		}
		time.Sleep(time.Millisecond)
	}
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	if m := maxActive.Load(); m > groups || m < 2 {
		t.Fatalf("%d groups published at once; the limit is %d (and groups should run in parallel)", m, groups)
	}
}

func TestProcessorCleanShutdownReleasesClaimedMessages(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	enqueue(t, st, 200, func(i int) string { return fmt.Sprintf("g%d", i%20) })
	started := make(chan struct{}, 100)
	release := make(chan struct{})
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []outbox.Result {
		started <- struct{}{}
		<-release // an in-flight publish that takes a while
		published.Add(int64(len(msgs)))
		return make([]outbox.Result, len(msgs))
	})
	p, err := outbox.NewProcessor(st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: 10 * time.Millisecond, MaxConcurrentGroups: 2, PublishBatchSize: 3, DrainTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, p)
	<-started
	<-started
	go func() { time.Sleep(100 * time.Millisecond); close(release) }()
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	c := counts(t, st)
	// The two in-flight batches finished and were recorded; everything
	// else claimed went back to PENDING without waiting for a lease.
	if c[outbox.StatusProcessing] != 0 {
		t.Fatalf("%d messages left PROCESSING after a clean shutdown", c[outbox.StatusProcessing])
	}
	if c[outbox.StatusSent] != published.Load() || c[outbox.StatusSent] != 6 {
		t.Fatalf("sent %d, published %d, want the 2 in-flight batches of 3", c[outbox.StatusSent], published.Load())
	}
	if c[outbox.StatusPending] != 194 {
		t.Fatalf("counts %v", c)
	}
	// Released messages have no attempt counted.
	page, _ := st.MessageList(context.Background(), outbox.MessageListParams{Status: outbox.StatusPending, Limit: 1000})
	for _, m := range page.Messages {
		if m.Attempts != 0 {
			t.Fatalf("released message %s has %d attempts", m.ID, m.Attempts)
		}
	}
}

func TestProcessorDrainTimeoutCancelsSlowPublish(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	enqueue(t, st, 5, func(int) string { return "" })
	started := make(chan struct{}, 10)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []outbox.Result {
		started <- struct{}{}
		<-ctx.Done() // never finishes on its own
		out := make([]outbox.Result, len(msgs))
		for i := range out {
			out[i].Err = ctx.Err()
		}
		return out
	})
	p, _ := outbox.NewProcessor(st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: 10 * time.Millisecond, DrainTimeout: 200 * time.Millisecond})
	stop := start(t, p)
	<-started
	err, took := stop()
	if err != nil {
		t.Fatal(err)
	}
	if took > 10*time.Second {
		t.Fatalf("shutdown took %s with a 200ms drain timeout", took)
	}
	c := counts(t, st)
	if c[outbox.StatusProcessing] != 0 || c[outbox.StatusPending] != 5 {
		t.Fatalf("cancelled publishes must be retried later: %v", c)
	}
}

func TestProcessorSurvivesMisbehavingPublishers(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ids := enqueue(t, st, 4, func(int) string { return "" })
	var calls atomic.Int64
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []outbox.Result {
		switch calls.Add(1) {
		case 1:
			panic("boom")
		case 2:
			return nil // no results at all
		}
		return make([]outbox.Result, len(msgs))
	})
	p, _ := outbox.NewProcessor(st, pub, outbox.Config{
		Topics:       []string{"t"},
		PollInterval: 10 * time.Millisecond, MaxConcurrentGroups: 1, PublishBatchSize: 10,
		Backoff: outbox.Backoff{Schedule: []time.Duration{time.Millisecond}},
	})
	stop := start(t, p)
	outboxtest.WaitDrained(t, st, "", 20*time.Second)
	stop()
	for _, id := range ids {
		m, err := st.MessageGet(context.Background(), outbox.MessageGetParams{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != outbox.StatusSent || m.Attempts != 3 {
			t.Fatalf("message %s: %s after %d attempts, want SENT after 3 (panic, missing result, ok)", id, m.Status, m.Attempts)
		}
	}
	att, _ := st.AttemptList(context.Background(), outbox.AttemptListParams{MessageID: ids[0]})
	if len(att) != 3 || att[0].Error == nil || att[0].Error.Code != "publisher_panic" || att[1].Error.Code != "missing_result" {
		t.Fatalf("attempt history: %+v", att)
	}
}

func TestProcessorWakesOnCommitWithoutPolling(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	rec := &outboxtest.Recorder{}
	p, _ := outbox.NewProcessor(st, rec, outbox.Config{Topics: []string{"t"}, PollInterval: time.Hour})
	stop := start(t, p)
	time.Sleep(50 * time.Millisecond) // the first poll has run and found nothing
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	err := st.InTx(context.Background(), func(tx *sql.Tx) error {
		_, err := ob.EnqueueTx(context.Background(), tx, outbox.Message{Topic: "t", Payload: []byte(`1`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitDrained(t, st, "", 10*time.Second) // far below the 1h poll interval
	stop()
	if len(rec.Sent()) != 1 {
		t.Fatalf("sent %v", rec.Sent())
	}
}

func TestProcessorRecoversAbandonedLeases(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ids := enqueue(t, st, 3, func(int) string { return "g" })
	// A processor that died: it claimed and never finished.
	claimed, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 10, Owner: "dead", Now: time.Now()})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	rec := &outboxtest.Recorder{}
	// The processing timeout is what recovers the dead processor's lease;
	// it is also the live processor's own lease, renewed by its heartbeat.
	// At 200 ms a loaded machine (CI beside other builds) let the live
	// processor's leases lapse too, until the messages reached their
	// recovery limit and were dead-lettered unpublished. 2 s keeps the
	// test about the dead processor.
	p, _ := outbox.NewProcessor(st, rec, outbox.Config{Topics: []string{"t"}, PollInterval: 10 * time.Millisecond, ProcessingTimeout: 2 * time.Second, RecoveryInterval: 50 * time.Millisecond})
	stop := start(t, p)
	outboxtest.WaitDrained(t, st, "", 30*time.Second)
	stop()
	if got := rec.Sent(); len(got) != 3 || got[0] != ids[0] || got[1] != ids[1] || got[2] != ids[2] {
		t.Fatalf("recovered messages published %v, want %v in order", got, ids)
	}
	// The dead processor's late outcome is refused by the lease fence.
	res, err := st.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "dead", Now: time.Now(),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeDead, ID: ids[0], Attempt: 1, ClaimToken: claimed[0].ClaimToken, Error: &outbox.ErrorInfo{Code: "late"}}}})
	if err != nil || len(res.LeaseLost) != 1 {
		t.Fatalf("stale outcome: %+v %v", res, err)
	}
	m, _ := st.MessageGet(context.Background(), outbox.MessageGetParams{ID: ids[0]})
	if m.Status != outbox.StatusSent {
		t.Fatalf("stale outcome overwrote the message: %s", m.Status)
	}
}

func TestProcessorRunTwiceAndNoGoroutineLeak(t *testing.T) {
	st := newStore(t)
	before := runtime.NumGoroutine()
	p, _ := outbox.NewProcessor(st, &outboxtest.Recorder{}, outbox.Config{Topics: []string{"t"}, PollInterval: 5 * time.Millisecond})
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(30 * time.Millisecond)
		if err := p.Run(ctx); err == nil {
			t.Fatal("a second concurrent Run must fail")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+1 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProcessorDeadLettersPermanentErrorsAndNotifiesObservers(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ids := enqueue(t, st, 2, func(int) string { return "" })
	obs := &recordingObserver{}
	pub := outbox.PublishEach(func(_ context.Context, m outbox.Message) outbox.Result {
		if m.ID == ids[0] {
			return outbox.Result{Err: outbox.Permanent("131026", "undeliverable")}
		}
		return outbox.Result{Err: errors.New("connection reset")}
	})
	p, _ := outbox.NewProcessor(st, pub, outbox.Config{
		Topics:       []string{"t"},
		PollInterval: 5 * time.Millisecond, MaxAttempts: 3, Observer: obs,
		Backoff: outbox.Backoff{Schedule: []time.Duration{time.Millisecond}},
	})
	stop := start(t, p)
	c := outboxtest.WaitDrained(t, st, "", 20*time.Second)
	stop()
	if c[outbox.StatusFailed] != 2 {
		t.Fatalf("counts %v", c)
	}
	m0, _ := st.MessageGet(context.Background(), outbox.MessageGetParams{ID: ids[0]})
	m1, _ := st.MessageGet(context.Background(), outbox.MessageGetParams{ID: ids[1]})
	if m0.Attempts != 1 || m0.LastError == nil || m0.LastError.Code != "131026" {
		t.Fatalf("permanent error: %+v", m0)
	}
	if m1.Attempts != 3 || m1.LastError == nil || m1.LastError.Code != "error" {
		t.Fatalf("exhausted retries: %+v", m1)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.started != 4 || obs.finished != 4 || obs.failed != 2 || obs.sent != 0 {
		t.Fatalf("observer: %+v", obs)
	}
}

type recordingObserver struct {
	outbox.NopObserver
	mu                              sync.Mutex
	started, finished, sent, failed int
}

func (o *recordingObserver) OnAttemptStarted(context.Context, outbox.AttemptEvent) {
	o.mu.Lock()
	o.started++
	o.mu.Unlock()
}

func (o *recordingObserver) OnAttemptFinished(context.Context, outbox.AttemptEvent) {
	o.mu.Lock()
	o.finished++
	o.mu.Unlock()
}

func (o *recordingObserver) OnSent(context.Context, outbox.AttemptEvent) {
	o.mu.Lock()
	o.sent++
	o.mu.Unlock()
}

func (o *recordingObserver) OnFailed(context.Context, outbox.AttemptEvent) {
	o.mu.Lock()
	o.failed++
	o.mu.Unlock()
}

func TestProcessorDeferDoesNotCountAttempts(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ids := enqueue(t, st, 2, func(int) string { return "g" })
	var calls atomic.Int64
	pub := outbox.PublishEach(func(_ context.Context, m outbox.Message) outbox.Result {
		if calls.Add(1) <= 10 {
			return outbox.Result{Err: outbox.Defer(5*time.Millisecond, "quota_exceeded", "daily quota used up")}
		}
		return outbox.Result{ProviderMessageID: "p-" + m.ID}
	})
	rec := &outboxtest.Recorder{}
	p, _ := outbox.NewProcessor(st, outbox.PublisherFunc(func(ctx context.Context, ms []outbox.Message) []outbox.Result {
		res := pub.Publish(ctx, ms)
		for i := range ms {
			if res[i].Err == nil {
				rec.Publish(ctx, ms[i:i+1])
			}
		}
		return res
	}), outbox.Config{Topics: []string{"t"}, PollInterval: 2 * time.Millisecond, MaxAttempts: 2})
	stop := start(t, p)
	c := outboxtest.WaitDrained(t, st, "", 20*time.Second)
	stop()
	// Ten deferrals, five times MaxAttempts, and nothing was dead-lettered.
	if c[outbox.StatusSent] != 2 || c[outbox.StatusFailed] != 0 {
		t.Fatalf("counts %v", c)
	}
	for _, id := range ids {
		m, _ := st.MessageGet(context.Background(), outbox.MessageGetParams{ID: id})
		if m.Attempts != 1 {
			t.Fatalf("message %s: %d attempts counted, want 1 (deferrals are free)", id, m.Attempts)
		}
	}
	if got := rec.Sent(); len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("published %v, want %v in order", got, ids)
	}
}

func TestDeferredReleaseHoldsTheMessageUntilItsDueTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ids := enqueue(t, st, 2, func(int) string { return "g" })
	now := time.Now()
	got, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p1", Now: now})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim %d %v", len(got), err)
	}
	_, err = st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p1", Now: now, Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeReleased, ID: ids[0], Attempt: 1, ClaimToken: got[0].ClaimToken, NextAttemptAt: now.Add(time.Hour), Error: &outbox.ErrorInfo{Code: "quota_exceeded", Message: "used up"}},
		{Kind: outbox.OutcomeReleased, ID: ids[1], Attempt: 1, ClaimToken: got[1].ClaimToken},
	}})
	if err != nil {
		t.Fatal(err)
	}
	// The deferred head holds back its group until it is due.
	if again, _ := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p1", Now: now.Add(time.Minute)}); len(again) != 0 {
		t.Fatalf("claimed %d messages behind a deferred head", len(again))
	}
	m, _ := st.MessageGet(ctx, outbox.MessageGetParams{ID: ids[0]})
	if m.Status != outbox.StatusPending || m.Attempts != 0 || m.LastError == nil || m.LastError.Code != "quota_exceeded" {
		t.Fatalf("deferred message: %+v", m)
	}
	later, _ := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p1", Now: now.Add(2 * time.Hour)})
	if len(later) != 2 || later[0].ID != ids[0] {
		t.Fatalf("after the due time: %d claimed", len(later))
	}
}
