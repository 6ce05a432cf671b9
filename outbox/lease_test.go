package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
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

func TestProcessorRecoveryDoesNotUseUpAttemptsButBoundsRecoveries(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	// One attempt only: a recovery that counted it would dead-letter the
	// message unpublished.
	res, err := ob.Enqueue(context.Background(), outbox.Message{Topic: "t", Payload: []byte(`1`), MaxAttempts: 1},
		outbox.Message{Topic: "poison", Payload: []byte(`2`)})
	if err != nil {
		t.Fatal(err)
	}
	id, poison := res[0].Message.ID, res[1].Message.ID
	claimAs := func(owner, topic string) {
		t.Helper()
		c, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 1, Topics: []string{topic}, Owner: owner, Now: time.Now()})
		if err != nil || len(c) != 1 {
			t.Fatalf("claim by %s: %d messages, %v", owner, len(c), err)
		}
	}
	// A processor that crashed holding the message.
	claimAs("crashed", "t")
	rec := &outboxtest.Recorder{}
	const maxRecoveries = 3
	p, err := outbox.NewProcessor(st, rec, outbox.Config{Topics: []string{"t"}, PollInterval: 10 * time.Millisecond,
		ProcessingTimeout: time.Second, RecoveryInterval: 20 * time.Millisecond, MaxRecoveries: maxRecoveries})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, p)
	if m := waitStatus(t, st, id, outbox.StatusSent); m.Attempts != 1 {
		t.Fatalf("recovered and sent with %d attempts, want 1", m.Attempts)
	}
	if got := rec.Sent(); len(got) != 1 || got[0] != id {
		t.Fatalf("published %v, want [%s] once", got, id)
	}
	// A message that kills every processor that takes it (here: claimed
	// and abandoned again and again; this processor only recovers it).
	for i := 1; i <= maxRecoveries; i++ {
		claimAs(fmt.Sprintf("killed-%d", i), "poison")
		if i < maxRecoveries {
			waitStatus(t, st, poison, outbox.StatusPending)
		}
	}
	m := waitStatus(t, st, poison, outbox.StatusFailed)
	if m.LastError == nil || m.LastError.Code != "lease_expired" {
		t.Fatalf("dead-lettered poison message: last error %+v, want lease_expired", m.LastError)
	}
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
}

// startPolling starts a processor of topic t on st that polls every 5 ms
// and leaves recovery to the test.
func startPolling(t *testing.T, st outbox.Store, pub outbox.Publisher) (stop func() (error, time.Duration)) {
	t.Helper()
	p, err := outbox.NewProcessor(st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: 5 * time.Millisecond,
		RecoveryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return start(t, p)
}

// waitStatus waits up to 30 s for message id to have status want and
// returns it.
func waitStatus(t *testing.T, st *sqlite.Store, id string, want outbox.Status) outbox.Message {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := st.MessageGet(context.Background(), outbox.MessageGetParams{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if m.Status == want {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("message not %s within 30 s: %s", want, m.Status)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recoverOne recovers every lease now, as another processor would once they
// expired, and wants exactly one.
func recoverOne(t *testing.T, st *sqlite.Store) {
	t.Helper()
	res, err := st.MessageRecover(context.Background(), outbox.MessageRecoverParams{ClaimedBefore: time.Now().Add(time.Hour), Now: time.Now()})
	if err != nil || res.Recovered != 1 {
		t.Fatalf("recover: %+v, %v", res, err)
	}
}

// awaitStall waits until st's first MessageFinish waits at its gate.
func awaitStall(t *testing.T, st *stallingStore) {
	t.Helper()
	select {
	case <-st.stalled:
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome was written within 30 s")
	}
}

// TestProcessorReleasesAReclaimWhileTheEarlierOutcomeIsWritten: the store
// stalls while the outcome of a message's lease is written, the lease
// expires meanwhile and is recovered (which gives the attempt back), and the
// processor claims the message again: the new lease has the same owner and
// attempt, and the store refuses the stalled outcome when it commits (its
// claim token is the earlier lease's; a store without tokens would let it
// finish the new lease). The processor must not publish the message again
// under the new lease: it records the refused outcome under it instead
// (without tokens, its release is refused): published once, and SENT.
func TestProcessorReleasesAReclaimWhileTheEarlierOutcomeIsWritten(t *testing.T) {
	t.Parallel()
	st := &stallingStore{Store: newStore(t), gate: make(chan struct{}), stalled: make(chan struct{})}
	id := enqueue(t, st.Store, 1, func(int) string { return "g" })[0]
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		published.Add(int64(len(msgs)))
		return make([]outbox.Result, len(msgs))
	})
	stop := startPolling(t, st, pub)
	unstall := sync.OnceFunc(func() { close(st.gate) })
	t.Cleanup(unstall)
	awaitStall(t, st)
	recoverOne(t, st.Store)
	// The processor claims it again while its outcome is still stalled.
	waitStatus(t, st.Store, id, outbox.StatusProcessing)
	time.Sleep(100 * time.Millisecond) // time to publish it again, if it would
	unstall()
	waitStatus(t, st.Store, id, outbox.StatusSent)
	time.Sleep(100 * time.Millisecond) // a later claim would publish it again
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	if n := published.Load(); n != 1 {
		t.Fatalf("published %d times, want once", n)
	}
	waitStatus(t, st.Store, id, outbox.StatusSent)
}

// TestProcessorLeavesOutTheOutcomeOfAReplacedLease: a publish outlives its
// lease, which is recovered and claimed again by the same processor (same
// owner and attempt) while the publish is still running. The outcome of
// the first publish, a release here, must not be written: it would release
// the new lease while the message is published under it. The message is
// published under the new lease and ends SENT: two publishes, not three.
func TestProcessorLeavesOutTheOutcomeOfAReplacedLease(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	id := enqueue(t, st, 1, func(int) string { return "" })[0]
	var calls atomic.Int64
	first, unblock := make(chan struct{}), make(chan struct{})
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		res := make([]outbox.Result, len(msgs))
		if calls.Add(int64(len(msgs))) == 1 {
			close(first)
			<-unblock
			res[0].Err = outbox.ErrNotAttempted
		}
		return res
	})
	stop := startPolling(t, st, pub)
	release := sync.OnceFunc(func() { close(unblock) })
	t.Cleanup(release)
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("not published within 30 s")
	}
	recoverOne(t, st)
	waitStatus(t, st, id, outbox.StatusProcessing) // claimed again while the first publish runs
	release()
	waitStatus(t, st, id, outbox.StatusSent)
	time.Sleep(100 * time.Millisecond) // a later claim would publish it again
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("published %d times, want 2 (under the first lease and the second)", n)
	}
}

// TestProcessorReleasesTheRestOfTheGroupWithAReclaim: a claim holds a
// message claimed again while its earlier lease's outcome (a retry) is
// being written, and the next message of its group: the processor
// releases both. Publishing the second would deliver it before the first,
// which has not been delivered yet.
func TestProcessorReleasesTheRestOfTheGroupWithAReclaim(t *testing.T) {
	t.Parallel()
	st := &stallingStore{Store: newStore(t), gate: make(chan struct{}), stalled: make(chan struct{})}
	first := enqueue(t, st.Store, 1, func(int) string { return "g" })[0]
	var mu sync.Mutex
	var log []string // "id:ok" per publish, in order
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		mu.Lock()
		defer mu.Unlock()
		res := make([]outbox.Result, len(msgs))
		for i, m := range msgs {
			ok := m.ID != first || len(log) > 0
			if !ok {
				res[i].Err = outbox.RetryAfter(10*time.Millisecond, "busy", "try again")
			}
			log = append(log, fmt.Sprintf("%s:%v", m.ID, ok))
		}
		return res
	})
	stop := startPolling(t, st, pub)
	unstall := sync.OnceFunc(func() { close(st.gate) })
	t.Cleanup(unstall)
	awaitStall(t, st) // the retry of the first message is being written
	second := enqueue(t, st.Store, 1, func(int) string { return "g" })[0]
	recoverOne(t, st.Store)
	// Both are claimed, in one claim, while the retry is still being
	// written.
	waitStatus(t, st.Store, second, outbox.StatusProcessing)
	time.Sleep(100 * time.Millisecond) // time to publish the second, if it would
	unstall()
	waitStatus(t, st.Store, first, outbox.StatusSent)
	waitStatus(t, st.Store, second, outbox.StatusSent)
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{first + ":false", first + ":true", second + ":true"}
	if fmt.Sprint(log) != fmt.Sprint(want) {
		t.Fatalf("publishes %v, want %v", log, want)
	}
}
