package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitWake(t *testing.T, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the wake-up channel closed", what)
		}
	case <-time.After(within):
		t.Fatalf("%s: no wake-up within %s", what, within)
	}
}

// drain empties ch without blocking.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// TestWakeupsOnCommitAndAfterReconnect: a commit wakes the listener within
// milliseconds (not before the commit), and after its connection is killed
// the listener reconnects and wakes again.
func TestWakeupsOnCommitAndAfterReconnect(t *testing.T) {
	t.Parallel()
	logs := &syncBuf{}
	b := setup(t, func(o *postgres.Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	ctx, cancel := context.WithCancel(b.ctx)
	ch := b.store.Wakeups(ctx)
	waitWake(t, ch, 5*time.Second, "initial wake-up after LISTEN") // sent once listening
	drain(ch)

	tx, err := b.pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ob.EnqueueTx(ctx, tx, msg("t", "g", 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("woken before the enqueueing transaction committed")
	case <-time.After(200 * time.Millisecond):
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, 2*time.Second, "after commit")
	if d := time.Since(committed); d > 500*time.Millisecond {
		t.Errorf("wake-up took %s after commit", d)
	}

	// Kill the listener's connection (and only it).
	var n int
	if err := b.pg.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND application_name = left('outboxkit listener ' || $1, 63)`, b.store.MessagesTable()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d listener connections: %v", n, err)
	}
	waitWake(t, ch, 5*time.Second, "wake-up after the connection loss")
	// It reconnects (and says so), then wakes once for what it may have
	// missed. Only after that can a wake-up show that it listens again:
	// the one that satisfied waitWake may be a late tick of the listener
	// that was killed, and the loss's own wake-up may still be on its way.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "reconnected"); {
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect log line; logs:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	// It listens again: a new enqueue wakes it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		drain(ch)
		b.enqueue(msg("t", "g", 2))
		select {
		case <-ch:
		case <-time.After(300 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("no wake-up after reconnect; logs:\n%s", logs.String())
			}
			continue
		}
		break
	}
	cancel()
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the channel was not closed after ctx ended")
	}
}

// TestWakeupsFallBackToPolling: when notifications cannot arrive (here: the
// dedicated connection goes to another database, as a transaction-mode
// pooler would route it) or there is no dedicated connection at all, the
// listener logs why and the channel stays open until ctx ends; a processor
// keeps working by polling.
func TestWakeupsFallBackToPolling(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 8)
	logs := &syncBuf{}
	otherDB := func(ctx context.Context) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(pg.DSN)
		if err != nil {
			return nil, err
		}
		cfg.Database = "template1"
		return pgx.ConnectConfig(ctx, cfg)
	}
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, Connect: otherDB, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	ch := s.Wakeups(wctx)
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(logs.String(), "notifications do not arrive, polling only") {
		if time.Now().After(deadline) {
			t.Fatalf("no fallback log line; logs:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The processor still delivers, by polling.
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	if _, err := ob.Enqueue(ctx, msg("t", "g", 1)); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	p, err := outbox.NewProcessor(s, outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		for _, m := range ms {
			select {
			case got <- m.ID:
			default:
			}
		}
		return make([]outbox.Result, len(ms))
	}), outbox.Config{AllTopics: true, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing published while polling")
	}
	pcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wcancel()
	for range ch { //nolint:revive // drain until closed
	}

	// No dedicated connection at all: a single *pgx.Conn as DB.
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	logs2 := &syncBuf{}
	s2, err := postgres.New(conn, postgres.Options{Schema: pg.Name, Logger: slog.New(slog.NewTextHandler(logs2, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c2ctx, c2cancel := context.WithCancel(ctx)
	ch2 := s2.Wakeups(c2ctx)
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(logs2.String(), "polling only") {
		t.Errorf("no fallback log line without a dedicated connection; logs:\n%s", logs2.String())
	}
	c2cancel()
	for range ch2 { //nolint:revive // drain until closed
	}
}

// notifyCounter counts the notifications on the store's channel, from a
// connection of its own.
type notifyCounter struct {
	n      atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

func countNotifications(t *testing.T, b *bundle) *notifyCounter {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(b.ctx, "LISTEN "+pgx.Identifier{b.store.MessagesTable()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	c := &notifyCounter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer func() { _ = conn.Close(context.Background()) }()
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			c.n.Add(1)
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// heldShared reports whether the backend pid holds an advisory lock in
// shared mode: an enqueue that skipped its NOTIFY does, until it ends.
func heldShared(t *testing.T, b *bundle, pid int32) bool {
	t.Helper()
	var n int
	if err := b.pg.Pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND mode = 'ShareLock' AND granted AND pid = $1`, pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// TestEnqueueNotifiesOnlyIdleListeners: NOTIFY makes PostgreSQL serialise
// committing transactions, so enqueues notify only when a listener waits
// for it. With no listener, none notifies; a burst of small transactions
// with a processor running sends far fewer notifications than
// transactions; and nothing is delayed to the poll interval (an hour
// here): every message of the burst, one enqueued right after it, and one
// whose transaction skipped NOTIFY and committed long after the burst are
// published within seconds.
func TestEnqueueNotifiesOnlyIdleListeners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	notes := countNotifications(t, b)
	time.Sleep(100 * time.Millisecond) // LISTEN is in place
	for i := range 20 {
		b.enqueue(msg("t", fmt.Sprintf("g%d", i%4), i))
	}
	time.Sleep(300 * time.Millisecond)
	if n := notes.n.Load(); n != 0 {
		t.Fatalf("%d notifications with no listener, want 0", n)
	}

	var mu sync.Mutex
	published := map[string]time.Time{}
	p, err := outbox.NewProcessor(b.store, outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			published[m.ID] = time.Now()
		}
		return make([]outbox.Result, len(ms))
	}), outbox.Config{AllTopics: true, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	defer func() {
		pcancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitPublished := func(id string, within time.Duration, what string) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			mu.Lock()
			_, ok := published[id]
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not published within %s (poll interval 1 h: a wake-up was lost)", what, within)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The startup wake-up claims what was enqueued before.
	if err := p.WaitDrained(b.ctx); err != nil {
		t.Fatal(err)
	}

	// A burst: 8 producers, 1 message per transaction.
	const producers, perProducer = 8, 40
	before := notes.n.Load()
	var ids []string
	var idsMu sync.Mutex
	var wg sync.WaitGroup
	for w := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				r, err := b.ob.Enqueue(b.ctx, msg("t", fmt.Sprintf("g%d", (w*perProducer+i)%50), i))
				if err != nil {
					t.Error(err)
					return
				}
				idsMu.Lock()
				ids = append(ids, r[0].Message.ID)
				idsMu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Right after the burst.
	after := b.enqueue(msg("t", "after", 1))[0].Message.ID
	waitPublished(after, 5*time.Second, "the message enqueued right after the burst")
	for _, id := range ids {
		waitPublished(id, 5*time.Second, "a message of the burst")
	}
	sent := notes.n.Load() - before
	t.Logf("%d notifications for %d enqueueing transactions", sent, producers*perProducer+1)
	if sent > producers*perProducer/2 {
		t.Errorf("%d notifications for %d enqueueing transactions: not coalesced", sent, producers*perProducer+1)
	}

	// A transaction that skips its NOTIFY (the listener is busy: another
	// producer keeps enqueueing) and commits well after every other
	// enqueue has stopped.
	var lateID string
	for attempt := 0; lateID == ""; attempt++ {
		if attempt == 20 {
			t.Fatal("the late transaction never skipped its NOTIFY")
		}
		stop := make(chan struct{})
		bg := make(chan struct{})
		go func() {
			defer close(bg)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := b.ob.Enqueue(b.ctx, msg("t", "bg", i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		tx, err := b.pg.Pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := b.ob.EnqueueTx(b.ctx, tx, msg("t", "late", attempt))
		if err != nil {
			t.Fatal(err)
		}
		var pid int32
		if err := tx.QueryRow(b.ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		close(stop)
		<-bg
		if !heldShared(t, b, pid) {
			// The listener was idle at that moment: this one notified.
			_ = tx.Rollback(b.ctx)
			continue
		}
		time.Sleep(500 * time.Millisecond) // the listener lingers, then waits for this transaction
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		lateID = r[0].Message.ID
		waitPublished(lateID, 5*time.Second, "the late transaction's message")
		mu.Lock()
		d := published[lateID].Sub(committed)
		mu.Unlock()
		t.Logf("the late transaction's message was published %s after its commit", d)
	}
}

// TestWakeupsSeveralListeners: with two listeners one holds the notify
// lock and both are woken by an enqueue; when the holder stops, or its
// connection dies without a word, the other takes over and enqueues still
// wake it.
func TestWakeupsSeveralListeners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx1, cancel1 := context.WithCancel(b.ctx)
	defer cancel1()
	ctx2, cancel2 := context.WithCancel(b.ctx)
	defer cancel2()
	ch1 := b.store.Wakeups(ctx1)
	waitWake(t, ch1, 5*time.Second, "listener 1 up")
	ch2 := b.store.Wakeups(ctx2)
	waitWake(t, ch2, 5*time.Second, "listener 2 up")
	time.Sleep(200 * time.Millisecond) // both settled (idle)
	drain(ch1)
	drain(ch2)
	b.enqueue(msg("t", "g", 1))
	waitWake(t, ch1, 2*time.Second, "listener 1 after an enqueue")
	waitWake(t, ch2, 2*time.Second, "listener 2 after an enqueue")

	// Stop listener 1 (the holder, or not: either way 2 must keep working).
	cancel1()
	for range ch1 { //nolint:revive // drain until closed
	}
	wakeAfterEnqueue := func(ch <-chan struct{}, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; ; i++ {
			drain(ch)
			b.enqueue(msg("t", "g", 100+i))
			select {
			case <-ch:
				return
			case <-time.After(3 * time.Second):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no wake-up", what)
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	wakeAfterEnqueue(ch2, "listener 2 after listener 1 stopped")

	// A third listener joins (a follower of 2, or the holder), then 2's
	// connection is killed: 3 must be woken by enqueues.
	ctx3, cancel3 := context.WithCancel(b.ctx)
	defer cancel3()
	ch3 := b.store.Wakeups(ctx3)
	waitWake(t, ch3, 5*time.Second, "listener 3 up")
	time.Sleep(300 * time.Millisecond)
	cancel2()       // 2 leaves cleanly; now only 3
	for range ch2 { //nolint:revive // drain until closed
	}
	ctx4, cancel4 := context.WithCancel(b.ctx)
	defer cancel4()
	ch4 := b.store.Wakeups(ctx4)
	waitWake(t, ch4, 5*time.Second, "listener 4 up")
	time.Sleep(300 * time.Millisecond)
	// Kill every listener connection but keep 4's context: one of 3 and 4
	// held the lock and vanished silently; both reconnect.
	var n int
	if err := b.pg.Pool.QueryRow(b.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND application_name = left('outboxkit listener ' || $1, 63)`, b.store.MessagesTable()).Scan(&n); err != nil || n != 2 {
		t.Fatalf("terminated %d listener connections, want 2: %v", n, err)
	}
	time.Sleep(500 * time.Millisecond)
	wakeAfterEnqueue(ch3, "listener 3 after the connections died")
	wakeAfterEnqueue(ch4, "listener 4 after the connections died")
}
