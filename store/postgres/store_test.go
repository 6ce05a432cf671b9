package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/postgres"
)

func TestNewValidatesOptions(t *testing.T) {
	t.Parallel()
	if _, err := postgres.New(nil, postgres.Options{}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("nil db: %v", err)
	}
	pg := testbackend.Postgres(t, 2)
	for _, o := range []postgres.Options{
		{Schema: "Bad-Schema"}, {Schema: "x; DROP TABLE y"}, {TablePrefix: `a"b`}, {TablePrefix: strings.Repeat("a", 40)}, {ClaimPerGroup: -1},
	} {
		if _, err := postgres.New(pg.Pool, o); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("%+v: err = %v, want ErrInvalidInput", o, err)
		}
	}
}

func TestMigrateIdempotentConcurrentAndDown(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 16)
	ctx := context.Background()
	schema := pg.Name + "_m" // Migrate creates the schema
	t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: schema, TablePrefix: "ob_"})
	if err != nil {
		t.Fatal(err)
	}
	// Ten replicas start at once.
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.Migrate(ctx) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	migs := s.Migrations()
	if v, err := s.SchemaVersion(ctx); err != nil || v != migs[len(migs)-1].Version {
		t.Fatalf("SchemaVersion = %d, %v", v, err)
	}
	// Migrations() renders the SQL, not its comments: a comment that names
	// the placeholders must still read as one after rendering.
	for _, m := range migs {
		for _, line := range strings.Split(m.Up+"\n"+m.Down, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "--") && strings.Contains(line, schema) {
				t.Fatalf("migration %d renders a comment with the schema name: %q", m.Version, line)
			}
		}
	}
	// The schema works, with the configured names.
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	if _, err := ob.Enqueue(ctx, msg("t", "g", 1)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pg.Pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".ob_messages").Scan(&n); err != nil || n != 1 {
		t.Fatalf("count = %d, %v", n, err)
	}
	// Down removes every table; up again works.
	if err := s.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("tables after down = %d, %v", n, err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != 0 {
		t.Fatalf("SchemaVersion after down = %d, %v", v, err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after down: %v", err)
	}
	if err := s.MigrateTo(ctx, 99); err == nil {
		t.Fatal("MigrateTo an unknown version succeeded")
	}
	// Every down script, run against a schema with data, leaves nothing.
	for _, m := range migs {
		if m.Up == "" || m.Down == "" {
			t.Fatalf("migration %d lacks a direction", m.Version)
		}
		if strings.Contains(m.Up, "{{") || strings.Contains(m.Down, "{{") {
			t.Fatalf("migration %d is not fully rendered", m.Version)
		}
	}
}

func TestEnqueueTxCommitRollbackAndIdempotency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx

	// Rolled back: never exists.
	tx, err := b.pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ob.EnqueueTx(ctx, tx, msg("t", "", 1)); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)

	// Committed, with a repeat of the key in the same tx and a bad message
	// that is refused before SQL: the tx stays usable.
	tx, err = b.pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := msg("t", "", 2)
	first.IdempotencyKey = "k1"
	r1, err := b.ob.EnqueueTx(ctx, tx, first)
	if err != nil || r1[0].Existed {
		t.Fatalf("first: %+v %v", r1, err)
	}
	again := msg("t", "", 3)
	again.IdempotencyKey = "k1"
	r2, err := b.ob.EnqueueTx(ctx, tx, again)
	if err != nil || !r2[0].Existed || r2[0].Message.ID != r1[0].Message.ID || payloadN(t, r2[0].Message) != 2 {
		t.Fatalf("repeat: %+v %v", r2, err)
	}
	for _, bad := range []outbox.Message{
		{Topic: "", Payload: []byte(`{}`)},
		{Topic: "t", Payload: []byte(`not json`)},
		{Topic: "t", Payload: []byte(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes) + `"`)},
		{Topic: "t", Tenant: "a\x00b", Payload: []byte(`{}`)},
		{Topic: "t", IdempotencyKey: strings.Repeat("k", 300), Payload: []byte(`{}`)},
	} {
		if _, err := b.store.MessageEnqueueTx(ctx, tx, outbox.MessageEnqueueParams{Messages: []outbox.Message{bad}}); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("bad message %q: err = %v", bad.Topic, err)
		}
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("tx unusable: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// After commit, the key still maps to the first message, through the
	// store's own transaction too.
	r3, err := b.ob.Enqueue(ctx, again)
	if err != nil || !r3[0].Existed || r3[0].Message.ID != r1[0].Message.ID {
		t.Fatalf("repeat after commit: %+v %v", r3, err)
	}
	cnt, err := b.store.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || cnt[outbox.StatusPending] != 1 {
		t.Fatalf("count = %v, %v", cnt, err)
	}
	got, err := b.store.MessageGet(ctx, outbox.MessageGetParams{ID: r1[0].Message.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := r1[0].Message
	if got.Seq != want.Seq || !got.CreatedAt.Equal(want.CreatedAt) || !got.NextAttemptAt.Equal(want.NextAttemptAt) || string(got.Payload) != string(want.Payload) {
		t.Fatalf("stored %+v, enqueue returned %+v", got, want)
	}
}

// TestEnqueueCallerIDClash: a caller-chosen ID already used by a message
// with another key is refused with an ErrInvalidInput error and the
// caller's transaction is aborted, so the call's other message, inserted
// before the clash was known, cannot commit; the same ID and key again is
// an idempotent repeat.
func TestEnqueueCallerIDClash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := outbox.NewID(time.Now())
	first := msg("t", "g", 1)
	first.ID, first.IdempotencyKey = id, "a"
	b.enqueue(first)
	clash := msg("t", "g", 2)
	clash.ID, clash.IdempotencyKey = id, "b"
	tx, err := b.pg.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.ob.EnqueueTx(b.ctx, tx, msg("t", "g2", 9), clash)
	if !errors.Is(err, outbox.ErrInvalidInput) || !strings.Contains(err.Error(), "ID") {
		t.Fatalf("clash: err = %v, want an ErrInvalidInput on ID", err)
	}
	if err := tx.Commit(b.ctx); err == nil {
		t.Fatal("the transaction of a refused call committed")
	}
	other := msg("t", "g", 3)
	other.ID, other.Tenant, other.IdempotencyKey = id, "other-tenant", "a"
	if _, err := b.ob.Enqueue(b.ctx, other); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("clash in another tenant: err = %v, want an ErrInvalidInput", err)
	}
	r := b.enqueue(first)
	if !r[0].Existed || payloadN(t, r[0].Message) != 1 {
		t.Fatalf("repeat of the first: %+v", r[0])
	}
	b.wantPending(1)
}

// TestEnqueueReturnedMessageAgain: keyless messages with generated IDs are
// inserted without a conflict check, yet a message the enqueue returned and
// is handed back (through Outbox, or straight to the store as prepared)
// repeats the stored one: the returned message no longer reports its ID as
// generated. In one call with a new message, the call is not aborted.
func TestEnqueueReturnedMessageAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue(msg("t", "g", 1))[0].Message
	if first.IDGenerated() {
		t.Fatal("Outbox returned a message that reports a generated ID")
	}
	if r := b.enqueue(first, msg("t", "g", 2)); !r[0].Existed || r[0].Message.ID != first.ID || r[1].Existed {
		t.Fatalf("the returned message again, with a new one: %+v", r)
	}
	direct, err := b.store.MessageEnqueue(b.ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{msg("t", "g", 3)}})
	if err != nil || direct[0].Message.IDGenerated() {
		t.Fatalf("direct enqueue: %v, IDGenerated %v", err, err == nil && direct[0].Message.IDGenerated())
	}
	r, err := b.store.MessageEnqueue(b.ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{direct[0].Message}})
	if err != nil || !r[0].Existed || payloadN(t, r[0].Message) != 3 {
		t.Fatalf("a returned message enqueued again: %+v, %v", r, err)
	}
	b.wantPending(3)
}

// TestEnqueueKeysAndKeylessIDs: a message enqueued without a key is
// identified by its ID (a repeat with the same caller-chosen ID returns it),
// and explicit keys are matched against explicit keys only: a key that
// equals a keyless message's ID, or a keyless ID that equals a stored key,
// is a new message (only keyed messages are in the idempotency index).
func TestEnqueueKeysAndKeylessIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := outbox.NewID(time.Now())
	keyless := msg("t", "g", 1)
	keyless.ID = id
	b.enqueue(keyless)
	again := msg("t", "g", 2)
	again.ID = id
	if r := b.enqueue(again)[0]; !r.Existed || payloadN(t, r.Message) != 1 {
		t.Fatalf("keyless repeat of a caller-chosen ID: %+v, want the first message", r)
	}
	keyed := msg("t", "g", 3)
	keyed.IdempotencyKey = id
	if r := b.enqueue(keyed)[0]; r.Existed || r.Message.ID == id {
		t.Fatalf("key = a keyless message's ID: %+v, want a new message", r)
	}
	if r := b.enqueue(keyed)[0]; !r.Existed || payloadN(t, r.Message) != 3 {
		t.Fatalf("repeat of the keyed message: %+v, want it", r)
	}
	b.wantPending(2)
}

func TestEnqueueSameKeyFromConcurrentTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	tx1, _ := b.pg.Pool.Begin(ctx)
	m := msg("t", "", 1)
	m.IdempotencyKey = "dup"
	r1, err := b.ob.EnqueueTx(ctx, tx1, m)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []outbox.Enqueued, 1)
	go func() {
		tx2, _ := b.pg.Pool.Begin(ctx)
		defer func() { _ = tx2.Rollback(ctx) }()
		r, err := b.ob.EnqueueTx(ctx, tx2, m) // waits for tx1
		if err != nil {
			t.Error(err)
		}
		if _, err := tx2.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("tx2 unusable: %v", err)
		}
		_ = tx2.Commit(ctx)
		done <- r
	}()
	time.Sleep(100 * time.Millisecond)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r2 := <-done
	if len(r2) != 1 || !r2[0].Existed || r2[0].Message.ID != r1[0].Message.ID {
		t.Fatalf("second transaction got %+v", r2)
	}
}

func TestEnqueueBatchOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = msg("t", fmt.Sprintf("g%d", i%7), i)
		msgs[i].Headers = map[string]string{"traceparent": fmt.Sprint(i)}
	}
	msgs[10].IdempotencyKey = "same"
	msgs[20].IdempotencyKey = "same" // repeats msgs[10] inside the batch
	res := b.enqueue(msgs...)
	if len(res) != 1000 {
		t.Fatalf("%d results", len(res))
	}
	if res[10].Existed || !res[20].Existed || res[20].Message.ID != res[10].Message.ID {
		t.Fatalf("in-batch repeat: %+v / %+v", res[10], res[20])
	}
	// Sequence follows batch order.
	for i := 1; i < len(res); i++ {
		if i == 20 || i == 21 {
			continue
		}
		if res[i].Message.Seq <= res[i-1].Message.Seq {
			t.Fatalf("seq not increasing at %d: %d <= %d", i, res[i].Message.Seq, res[i-1].Message.Seq)
		}
	}
	got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: res[5].Message.ID})
	if err != nil || got.Headers["traceparent"] != "5" || got.Group != "g5" {
		t.Fatalf("get: %+v %v", got, err)
	}
}

func TestEnqueueDatabaseSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := stdlib.OpenDBFromPool(b.pg.Pool)
	t.Cleanup(func() { _ = db.Close() })
	ob := outbox.New[*sql.Tx](b.store.SQL(), outbox.Options{})
	tx, err := db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := msg("t", "g", 1)
	m.IdempotencyKey = "sql-1"
	m.Headers = map[string]string{"a": "b"}
	r1, err := ob.EnqueueTx(b.ctx, tx, m, msg("t", "g", 2))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ob.EnqueueTx(b.ctx, tx, m)
	if err != nil || !r2[0].Existed || r2[0].Message.ID != r1[0].Message.ID || r2[0].Message.Headers["a"] != "b" {
		t.Fatalf("repeat: %+v %v", r2, err)
	}
	if _, err := ob.EnqueueTx(b.ctx, tx, outbox.Message{Topic: "t", Payload: []byte("{")}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("bad payload: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ms := b.claim("p", 10)
	if len(ms) != 2 || ms[0].ID != r1[0].Message.ID || ms[1].ID != r1[1].Message.ID {
		t.Fatalf("claimed %v", ids(ms))
	}
	// Own transaction through the SQL enqueuer.
	if _, err := ob.Enqueue(b.ctx, msg("t", "", 3)); err != nil {
		t.Fatal(err)
	}
}

// TestPingBeforeMigrate: the processor's start probe (outbox.Pinger) tells
// an unmigrated store from a reachable one without reading a message.
func TestPingBeforeMigrate(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 2)
	ctx := context.Background()
	schema := pg.Name + "_p"
	t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Ping before Migrate = %v, want ErrNotMigrated", err)
	}
	// Run probes with Ping first (that Run calls Ping is shown by
	// TestAppendOnlyIsRecordedAndEnforced: only Ping checks the storage
	// mode).
	err = outbox.Run(ctx, s, &outboxtest.Recorder{}, outbox.Config{AllTopics: true})
	if !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Run before Migrate = %v, want ErrNotMigrated", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after Migrate: %v", err)
	}
}
