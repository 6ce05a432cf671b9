package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

func enqueueOne(t *testing.T, st *sqlite.Store, topic string) outbox.Message {
	t.Helper()
	res, err := outbox.New[*sql.Tx](st, outbox.Options{}).Enqueue(context.Background(),
		outbox.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return res[0].Message
}

func TestMigrateUpDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if v, err := st.SchemaVersion(ctx); err != nil || v != 0 {
		t.Fatalf("SchemaVersion of a new file: %d, %v; want 0", v, err)
	}
	if _, err := st.MessageCount(ctx, outbox.MessageCountParams{}); err == nil {
		t.Fatal("MessageCount before Migrate succeeded")
	}

	// Many replicas migrate at once: one applies, the others find it done.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			other, err := sqlite.Open(ctx, path, sqlite.Options{})
			if err != nil {
				errs <- err
				return
			}
			defer other.Close()
			errs <- other.Migrate(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	migs := st.Migrations()
	if v, err := st.SchemaVersion(ctx); err != nil || v != migs[len(migs)-1].Version || v < 4 {
		t.Fatalf("SchemaVersion: %d, %v; want %d", v, err, migs[len(migs)-1].Version)
	}
	m := enqueueOne(t, st, "t")

	if err := st.MigrateDown(ctx); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	if v, err := st.SchemaVersion(ctx); err != nil || v != 0 {
		t.Fatalf("SchemaVersion after MigrateDown: %d, %v; want 0", v, err)
	}
	var n int
	if err := st.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'outbox_%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d outbox tables or indexes left after MigrateDown (%v)", n, err)
	}
	// Expect failure: the store has no schema any more.
	if _, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p"}); err == nil {
		t.Fatal("MessageClaim without a schema succeeded")
	}
	// And up again, empty.
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after MigrateDown: %v", err)
	}
	if _, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: m.ID}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("MessageGet after down and up: %v, want ErrNotFound", err)
	}
	enqueueOne(t, st, "t")
}

func TestTablePrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "p.db")
	events, err := sqlite.Open(ctx, path, sqlite.Options{TablePrefix: "outbox_events_"})
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	jobs, err := sqlite.New(events.DB(), sqlite.Options{TablePrefix: "outbox_dispatch_jobs_"})
	if err != nil {
		t.Fatal(err)
	}
	defer jobs.Close()
	for _, st := range []*sqlite.Store{events, jobs} {
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	enqueueOne(t, events, "EVENT")
	enqueueOne(t, events, "EVENT")
	enqueueOne(t, jobs, "DISPATCH_JOB")
	ce, _ := events.MessageCount(ctx, outbox.MessageCountParams{})
	cj, _ := jobs.MessageCount(ctx, outbox.MessageCountParams{})
	if ce[outbox.StatusPending] != 2 || cj[outbox.StatusPending] != 1 {
		t.Fatalf("counts %v and %v; want 2 and 1 (separate tables)", ce, cj)
	}
	var n int
	if err := events.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_dispatch_jobs_messages`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("outbox_dispatch_jobs_messages holds %d rows (%v), want 1", n, err)
	}
	for _, bad := range []string{"x; DROP TABLE y", "a-b", "ünï", strings.Repeat("a", 65)} {
		if _, err := sqlite.New(events.DB(), sqlite.Options{TablePrefix: bad}); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Fatalf("TablePrefix %q: %v, want ErrInvalidInput", bad, err)
		}
	}
}

func TestOpenAndNewRejectBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, path := range []string{"", ":memory:", "file::memory:?cache=shared", "x.db?_pragma=foo"} {
		if _, err := sqlite.Open(ctx, path, sqlite.Options{}); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Fatalf("Open(%q): %v, want ErrInvalidInput", path, err)
		}
	}
	if _, err := sqlite.New(nil, sqlite.Options{}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("New(nil): %v, want ErrInvalidInput", err)
	}
	if _, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "missing-dir", "x.db"), sqlite.Options{}); err == nil {
		t.Fatal("Open in a directory that does not exist succeeded")
	}
}

// drained reports whether ch has no value waiting, emptying it first of at
// most one.
func signalled(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestWakeups(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newStore(t, sqlite.Options{})
	ch := st.Wakeups(ctx)
	if signalled(ch) {
		t.Fatal("a signal before anything happened")
	}
	ob := outbox.New[*sql.Tx](st, outbox.Options{})

	if _, err := ob.Enqueue(ctx, outbox.Message{Topic: "t", Payload: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	if !signalled(ch) {
		t.Fatal("no signal after MessageEnqueue committed")
	}

	// EnqueueTx in the caller's own transaction: the store cannot see the
	// commit, so no signal; InTx signals after its commit.
	err := st.InTx(ctx, func(tx *sql.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "t", Payload: []byte(`2`)})
		if signalled(ch) {
			t.Error("a signal before the commit")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !signalled(ch) {
		t.Fatal("no signal after InTx committed")
	}

	boom := errors.New("boom")
	err = st.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "t", IdempotencyKey: "rolled-back", Payload: []byte(`3`)}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v, want fn's error", err)
	}
	if signalled(ch) {
		t.Fatal("a signal after InTx rolled back")
	}
	page, _ := st.MessageList(ctx, outbox.MessageListParams{})
	if len(page.Messages) != 2 {
		t.Fatalf("%d messages stored, want 2 (the rolled-back one is not)", len(page.Messages))
	}

	// A finished message may unblock its group: Finish signals too.
	c, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p"})
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	_ = signalled(ch)
	if _, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken}}}); err != nil {
		t.Fatal(err)
	}
	if !signalled(ch) {
		t.Fatal("no signal after MessageFinish")
	}

	// Notify coalesces: many events, one value waiting.
	for range 5 {
		st.Notify()
	}
	if !signalled(ch) || signalled(ch) {
		t.Fatal("Notify: want exactly one value waiting")
	}

	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			// A last signal may be waiting; the close follows.
			if _, ok := <-ch; ok {
				t.Fatal("channel still open after ctx ended")
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wakeups channel not closed after ctx ended")
	}
}

func TestWakeupsClosedByClose(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "w.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ch := st.Wakeups(context.Background())
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("a value instead of a close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wakeups channel not closed by Close")
	}
	if _, ok := <-st.Wakeups(context.Background()); ok {
		t.Fatal("Wakeups after Close returned an open channel")
	}
}

func TestMessageListTxSeesUncommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t, sqlite.Options{})
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // ends the test's transaction
	if _, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: []byte(`{"id":1}`)}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireEnqueuedTx[*sql.Tx](t, st, tx, outboxtest.Want{Topic: "orders", Payload: []byte(`{"id": 1}`), Count: 1})
	if _, err := st.MessageListTx(ctx, nil, outbox.MessageListParams{}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("MessageListTx(nil): %v, want ErrInvalidInput", err)
	}
	if _, err := st.MessageEnqueueTx(ctx, nil, outbox.MessageEnqueueParams{}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("MessageEnqueueTx(nil): %v, want ErrInvalidInput", err)
	}
}

func TestContextHonoured(t *testing.T) {
	t.Parallel()
	st := newStore(t, sqlite.Options{})
	enqueueOne(t, st, "t")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("MessageClaim with a cancelled ctx: %v, want context.Canceled", err)
	}
	// The store is fine afterwards and nothing was claimed.
	c, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 1, Owner: "p"})
	if err != nil || len(c) != 1 || c[0].Attempts != 1 {
		t.Fatalf("claim after a cancelled one: %+v, %v", c, err)
	}
}

// An application transaction holding SQLite's write lock makes the store's
// writers wait (busy timeout), not fail.
func TestWritersWaitForTheApplicationsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t, sqlite.Options{})
	enqueueOne(t, st, "t")
	tx, err := st.DB().BeginTx(ctx, nil) // BEGIN IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE app (id INTEGER)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p"})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("MessageClaim behind an application transaction: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("MessageClaim never finished")
	}
}

func TestClaimSpreadsOverGroupsAndFillsFromDeepOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t, sqlite.Options{ClaimPerGroup: 4})
	var msgs []outbox.Message
	for i := range 60 {
		msgs = append(msgs, outbox.Message{Topic: "t", Group: []string{"a", "b", "c"}[i%3], Payload: []byte(`1`)})
	}
	if _, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	perGroup := func(ms []outbox.Message) map[string]int {
		n := map[string]int{}
		for _, m := range ms {
			n[m.Group]++
		}
		return n
	}
	// Many groups claimable: at most 4 of each.
	got, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 12, Owner: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if n := perGroup(got); len(got) != 12 || n["a"] != 4 || n["b"] != 4 || n["c"] != 4 {
		t.Fatalf("claim of 12 over 3 groups: %v, want 4 of each", n)
	}
	// Release b and c; a is held, so only b and c are claimable: the claim
	// extends their runs past 4 to fill its limit.
	var rel []outbox.Outcome
	for _, m := range got {
		if m.Group != "a" {
			rel = append(rel, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
	}
	if _, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Outcomes: rel}); err != nil {
		t.Fatal(err)
	}
	got, err = st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 30, Owner: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if n := perGroup(got); len(got) != 30 || n["a"] != 0 || n["b"]+n["c"] != 30 {
		t.Fatalf("claim of 30 with a held: %v, want 30 from b and c", n)
	}
}
