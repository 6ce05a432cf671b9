package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// An application transaction that has begun but not written yet must not
// hold SQLite's write lock: the processor keeps claiming and recording
// meanwhile.
func TestOpenApplicationTransactionDoesNotStallTheProcessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{BusyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New(st, outbox.Options{})
	if _, err := ob.Enqueue(ctx, outbox.Message{Topic: "t", Payload: []byte(`1`)}, outbox.Message{Topic: "t", Payload: []byte(`2`)}); err != nil {
		t.Fatal(err)
	}

	// The application begins a transaction (and, say, calls a remote
	// service); it will write later.
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()

	rec := &outboxtest.Recorder{}
	p, err := outbox.NewProcessor(st, rec, outbox.Config{Topics: []string{"t"}, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() { stop(); <-done }()
	// Well under the busy timeout: with the write lock taken at BEGIN the
	// processor's first claim would wait the whole 20 s.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.WaitDrained(wctx); err != nil {
		t.Fatalf("the processor did not drain while an application transaction was open: %v (progress %+v)", err, p.Progress())
	}
	if got := len(rec.Sent()); got != 2 {
		t.Fatalf("%d sent, want 2", got)
	}
	// The application's transaction still writes and commits afterwards.
	if _, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "t", Payload: []byte(`3`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// InTx's transactions take the write lock at BEGIN: one that reads, then
// writes, while other writers commit never fails with SQLITE_BUSY (a
// deferred transaction would, on its lock upgrade).
func TestInTxReadThenWriteNeverBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New(st, outbox.Options{})
	const writers, each = 8, 15
	errs := make(chan error, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				errs <- st.InTx(ctx, func(tx *sql.Tx) error {
					var n int
					if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages`).Scan(&n); err != nil {
						return err
					}
					_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "t", Group: fmt.Sprint("g", w), Payload: fmt.Appendf(nil, `%d`, i)})
					return err
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("InTx: %v", err)
		}
	}
	c, err := st.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || c[outbox.StatusPending] != writers*each {
		t.Fatalf("pending %v (%v), want %d", c, err, writers*each)
	}
}
