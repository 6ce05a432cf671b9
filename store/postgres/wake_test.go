package postgres_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
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
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %'
		AND query LIKE '%' || $1 || '%'`, b.store.Schema()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d listener connections: %v", n, err)
	}
	waitWake(t, ch, 5*time.Second, "wake-up after the connection loss")
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
	if !strings.Contains(logs.String(), "reconnected") {
		t.Errorf("no reconnect log line; logs:\n%s", logs.String())
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
