package mysql_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

func tableCount(t *testing.T, db *sql.DB, prefix string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name LIKE CONCAT(?, '%')`, prefix).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMigrateUpDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := testbackend.MySQL(t, 12)
	st, err := mysql.New(d.DB, mysql.Options{TablePrefix: "mig_"})
	if err != nil {
		t.Fatal(err)
	}
	// Replicas starting at once: every Migrate succeeds, the schema is
	// applied once.
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := mysql.New(d.DB, mysql.Options{TablePrefix: "mig_"})
			if err == nil {
				err = s.Migrate(ctx)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	migs := st.Migrations()
	newest := migs[len(migs)-1].Version
	if v, err := st.SchemaVersion(ctx); err != nil || v != newest || v < 1 {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, newest)
	}
	// messages, attempts, groups, schema_version (001) and inbox (002).
	if n := tableCount(t, d.DB, "mig_"); n != 6 {
		t.Fatalf("%d tables after Migrate, want 6 (with pauses, 003)", n)
	}
	// Idempotent.
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if _, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{{Topic: "t", Payload: json.RawMessage(`1`)}}}); err != nil {
		t.Fatalf("enqueue after Migrate: %v", err)
	}
	// Another prefix in the same database is independent.
	other, _ := mysql.New(d.DB, mysql.Options{})
	if err := other.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateDown(ctx); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	if n := tableCount(t, d.DB, "mig_"); n != 0 {
		t.Fatalf("%d tables after MigrateDown, want 0", n)
	}
	if v, err := st.SchemaVersion(ctx); err != nil || v != 0 {
		t.Fatalf("SchemaVersion after down = %d, %v; want 0", v, err)
	}
	if n := tableCount(t, d.DB, "outbox_"); n != 6 {
		t.Fatalf("MigrateDown of mig_ touched outbox_: %d tables", n)
	}
	// Down twice is harmless; up again works.
	if err := st.MigrateDown(ctx); err != nil {
		t.Fatalf("second MigrateDown: %v", err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after down: %v", err)
	}
	if _, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{{Topic: "t", Payload: json.RawMessage(`1`)}}}); err != nil {
		t.Fatalf("enqueue after up, down, up: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := mysql.New(nil, mysql.Options{}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("New(nil): %v", err)
	}
	db, _ := sql.Open("mysql", "root@tcp(127.0.0.1:1)/x")
	defer db.Close()
	if _, err := mysql.New(db, mysql.Options{TablePrefix: "bad-prefix;"}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("New with a bad prefix: %v", err)
	}
}

// TestGroupCommitOrderIsSeqOrder: two transactions enqueue into one group;
// the second tries to commit first. It must wait for the first (the group's
// row lock), so no claimer ever sees message 2 of the group before
// message 1.
func TestGroupCommitOrderIsSeqOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mysql.Options{})
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	now := time.Now().UTC()

	tx1, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := ob.EnqueueTx(ctx, tx1, outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(`1`)})
	if err != nil {
		t.Fatal(err)
	}
	// An unrelated group is not blocked.
	if _, err := ob.Enqueue(ctx, outbox.Message{Topic: "t", Group: "other", Payload: json.RawMessage(`0`)}); err != nil {
		t.Fatalf("enqueue into another group while g is locked: %v", err)
	}

	type result struct {
		res []outbox.Enqueued
		err error
	}
	done := make(chan result, 1)
	go func() {
		tx2, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			done <- result{err: err}
			return
		}
		res, err := ob.EnqueueTx(ctx, tx2, outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(`2`)})
		if err != nil {
			_ = tx2.Rollback()
			done <- result{err: err}
			return
		}
		done <- result{res: res, err: tx2.Commit()}
	}()
	select {
	case r := <-done:
		t.Fatalf("the second transaction enqueued into g and committed before the first: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	// Nothing of g is claimable yet (only the other group's message).
	got, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: now.Add(time.Second), Topics: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range got {
		if m.Group == "g" {
			t.Fatalf("claimed %s of g before the first transaction committed", m.ID)
		}
	}
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	var r2 result
	select {
	case r2 = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second transaction is still blocked after the first committed")
	}
	if r2.err != nil {
		t.Fatalf("second transaction: %v", r2.err)
	}
	m1, m2 := r1[0].Message, r2.res[0].Message
	if m1.Seq >= m2.Seq {
		t.Fatalf("seq %d (committed first) >= seq %d", m1.Seq, m2.Seq)
	}
	got, err = st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: now.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != m1.ID || got[1].ID != m2.ID {
		t.Fatalf("claim after both commits: %v; want %s, %s", got, m1.ID, m2.ID)
	}
}

// TestDSNTimeSettings: parseTime, a non-UTC loc and session time zone, and
// clientFoundRows change nothing: times are stored and read back as the same
// instants, and a repeated key is still a repeat.
func TestDSNTimeSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := testbackend.MySQL(t, 4)
	db := openDSN(t, d.DSN, func(cfg *gomysql.Config) {
		cfg.ParseTime = true
		cfg.Loc = time.FixedZone("UTC+5", 5*3600)
		cfg.Params = map[string]string{"time_zone": "'-07:00'"}
		cfg.ClientFoundRows = true
	})
	plain, _ := mysql.New(d.DB, mysql.Options{})
	parsed, _ := mysql.New(db, mysql.Options{})
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 29, 1, 30, 0, 123456000, time.UTC)
	res, err := parsed.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Now: at, Messages: []outbox.Message{
		{Topic: "t", Payload: json.RawMessage(`1`), NextAttemptAt: at.Add(time.Hour).In(time.FixedZone("X", -3*3600))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*mysql.Store{plain, parsed} {
		m, err := s.MessageGet(ctx, outbox.MessageGetParams{ID: res[0].Message.ID})
		if err != nil {
			t.Fatal(err)
		}
		if !m.CreatedAt.Equal(at) || !m.NextAttemptAt.Equal(at.Add(time.Hour)) {
			t.Fatalf("read back CreatedAt %v NextAttemptAt %v; want %v, %v", m.CreatedAt, m.NextAttemptAt, at, at.Add(time.Hour))
		}
	}
	// clientFoundRows does not turn a repeated key into a new message.
	rep, err := parsed.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Now: at, Messages: []outbox.Message{
		{Topic: "t", IdempotencyKey: res[0].Message.IdempotencyKey, Payload: json.RawMessage(`2`)},
	}})
	if err != nil || !rep[0].Existed || rep[0].Message.ID != res[0].Message.ID {
		t.Fatalf("repeat with clientFoundRows: %+v, %v; want the original with Existed", rep, err)
	}
	if got, _ := parsed.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p", Now: at.Add(59 * time.Minute)}); len(got) != 0 {
		t.Fatalf("claimed a message before it was due")
	}
	if got, _ := parsed.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p", Now: at.Add(time.Hour)}); len(got) != 1 {
		t.Fatalf("did not claim the message when due")
	}
}

// TestInTxWakesProcessor is the package example, checked: a message
// enqueued with InTx is published at once by a processor whose poll
// interval is a minute, because InTx woke it.
func TestInTxWakesProcessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mysql.Options{})
	published := make(chan string, 1)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		out := make([]outbox.Result, len(msgs))
		for i, m := range msgs {
			published <- string(m.Payload)
			out[i] = outbox.Result{ProviderMessageID: "demo-1"}
		}
		return out
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, st, pub, outbox.Config{Topics: []string{"orders"}, PollInterval: time.Minute})
	}()
	defer func() { stop(); <-done }()
	time.Sleep(200 * time.Millisecond) // let the processor's first poll pass
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	err := st.InTx(ctx, func(tx *sql.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Group: "customer-7", Payload: []byte(`{"order":1}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-published:
		if p != `{"order":1}` {
			t.Fatalf("published %s", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not published within 10 s: InTx did not wake the processor")
	}
}
