package postgres_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// Options.AppendOnly is recorded in the database by Migrate, and a store
// that disagrees with the record refuses to start; migrating to version
// 13 leaves append-only storage with every message in its state.
func TestAppendOnlyIsRecordedAndEnforced(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 8)
	ctx := context.Background()
	open := func(appendOnly bool) *postgres.Store {
		t.Helper()
		s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, AppendOnly: appendOnly})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	plain, log := open(false), open(true)
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A default store enqueues to a group the registry does not hold
	// (only the append-only path registers groups).
	if _, err := outbox.New[pgx.Tx](plain, outbox.Options{}).Enqueue(ctx, msg("t", "before-switch", 0)); err != nil {
		t.Fatal(err)
	}
	// The database is on the default path: an append-only store refuses
	// it until Migrate (with AppendOnly) records the switch.
	if err := log.Ping(ctx); !errors.Is(err, postgres.ErrStorageMode) {
		t.Fatalf("append-only store on a default database: Ping = %v, want ErrStorageMode", err)
	}
	if err := log.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.Ping(ctx); err != nil {
		t.Fatalf("append-only store after its Migrate: Ping = %v", err)
	}
	// The default path's claim indexes are gone: an enqueued row is
	// written to the indexes the append-only path reads, and no others.
	// Its own index of unordered messages is there instead.
	defaultIndexes := []string{"outbox_messages_claim_ordered", "outbox_messages_claim_unordered", "outbox_messages_tenant_seq_unleased"}
	wantIndexes := func(want bool) {
		t.Helper()
		for _, ix := range append(defaultIndexes, "!outbox_messages_unordered_seq") {
			want := want
			if n, ok := strings.CutPrefix(ix, "!"); ok {
				ix, want = n, !want
			}
			var exists bool
			if err := pg.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pg.Name+"."+ix).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if exists != want {
				t.Fatalf("index %s exists: %v, want %v", ix, exists, want)
			}
		}
	}
	wantIndexes(false)
	// The switch registered the group of the message enqueued before it
	// (prune, fair share and the backstop read the registry's groups).
	var registered bool
	if err := pg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pg.Name+`.outbox_groups WHERE topic = 't' AND grp = 'before-switch')`).Scan(&registered); err != nil || !registered {
		t.Fatalf("group enqueued before the switch registered: %v, %v", registered, err)
	}
	if _, err := pg.Pool.Exec(ctx, `DELETE FROM `+pg.Name+`.outbox_messages WHERE grp = 'before-switch'`); err != nil {
		t.Fatal(err)
	}
	wantFill := func(want string) {
		t.Helper()
		var opts []string
		if err := pg.Pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass($1)`,
			pg.Name+".outbox_messages").Scan(&opts); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(opts, "fillfactor="+want) {
			t.Fatalf("messages table options %v, want fillfactor=%s", opts, want)
		}
	}
	wantFill("100")
	if err := log.Migrate(ctx); err != nil {
		t.Fatalf("append-only store's second Migrate: %v", err)
	}
	// Now a default store refuses to start: it would take what the marks
	// finished as PENDING.
	if err := plain.Ping(ctx); !errors.Is(err, postgres.ErrStorageMode) {
		t.Fatalf("default store on an append-only database: Ping = %v, want ErrStorageMode", err)
	}
	if err := plain.Migrate(ctx); !errors.Is(err, postgres.ErrStorageMode) {
		t.Fatalf("default store's Migrate on an append-only database = %v, want ErrStorageMode", err)
	}
	err := outbox.Run(ctx, plain, &outboxtest.Recorder{}, outbox.Config{AllTopics: true})
	if !errors.Is(err, postgres.ErrStorageMode) {
		t.Fatalf("Run of a default store on an append-only database = %v, want ErrStorageMode", err)
	}

	// The append-only store sends three messages and leases two.
	ob := outbox.New[pgx.Tx](log, outbox.Options{})
	if _, err := ob.Enqueue(ctx, msg("t", "g", 0), msg("t", "g", 1), msg("t", "g", 2), msg("t", "h", 3), msg("t", "h", 4)); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Second)
	got, err := log.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: now})
	if err != nil || len(got) != 5 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	var outs []outbox.Outcome
	for _, m := range got {
		if m.Group == "g" {
			outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
	}
	if res, err := log.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: now, Outcomes: outs}); err != nil || len(res.LeaseLost) > 0 {
		t.Fatalf("finish: %+v, %v", res, err)
	}
	want := map[outbox.Status]int64{outbox.StatusSent: 3, outbox.StatusProcessing: 2}
	wantCounts := func(s *postgres.Store) {
		t.Helper()
		c, err := s.MessageCount(ctx, outbox.MessageCountParams{})
		if err != nil {
			t.Fatal(err)
		}
		for st, n := range want {
			if c[st] != n {
				t.Fatalf("counts %v, want %v", c, want)
			}
		}
	}
	wantCounts(log)

	// Leaving: every processor stopped, migrate to version 13. The rows
	// hold what the marks said; a default store works on them, and an
	// append-only one refuses the database until it is migrated again.
	if err := log.MigrateTo(ctx, 13); err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); err != nil {
		t.Fatalf("default store's Migrate after leaving append-only storage: %v", err)
	}
	if err := plain.Ping(ctx); err != nil {
		t.Fatalf("default store's Ping after leaving: %v", err)
	}
	wantCounts(plain)
	// The default path's claim indexes are back, and its claims work.
	wantIndexes(true)
	wantFill("85")
	if _, err := outbox.New[pgx.Tx](plain, outbox.Options{}).Enqueue(ctx, msg("t", "k", 5), msg("t", "", 6)); err != nil {
		t.Fatal(err)
	}
	got, err = plain.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "q", Now: now.Add(time.Second)})
	if err != nil || len(got) != 2 {
		t.Fatalf("default store's claim after leaving: %d messages, %v; want the 2 new ones", len(got), err)
	}
	if err := log.Ping(ctx); !errors.Is(err, postgres.ErrStorageMode) {
		t.Fatalf("append-only store after leaving: Ping = %v, want ErrStorageMode", err)
	}
}

// An append-only store registers every ordered group it enqueues to, and
// skips the registry's probe only for groups whose registration it saw
// commit: its own committed enqueues and the messages it claimed, never an
// enqueue in the caller's transaction (which may roll back).
func TestAppendOnlyRegistersGroups(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 8)
	ctx := context.Background()
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, AppendOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	registered := func(grp string) bool {
		t.Helper()
		var ok bool
		if err := pg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pg.Name+`.outbox_groups WHERE topic = 't' AND grp = $1)`, grp).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	unregister := func(grp string) {
		t.Helper()
		if _, err := pg.Pool.Exec(ctx, `DELETE FROM `+pg.Name+`.outbox_groups WHERE topic = 't' AND grp = $1`, grp); err != nil {
			t.Fatal(err)
		}
	}
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	// enqueueCommitted enqueues m in the caller's transaction, committed.
	enqueueCommitted := func(m outbox.Message) {
		t.Helper()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.EnqueueTx(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Enqueued twice in a transaction that rolls back: the second call
	// meets the first's registration, which the rollback undoes.
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := ob.EnqueueTx(ctx, tx, msg("t", "rolled-back", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(ctx, msg("t", "rolled-back", 2)); err != nil {
		t.Fatal(err)
	}
	if !registered("rolled-back") {
		t.Fatal("a group first enqueued in a rolled-back transaction, then committed, is not registered")
	}

	// A committed enqueue of its own teaches the store its group: the
	// next enqueue skips the registry (shown by a row removed behind its
	// back, which it does not write again).
	if _, err := ob.Enqueue(ctx, msg("t", "known", 0)); err != nil {
		t.Fatal(err)
	}
	unregister("known")
	if _, err := ob.Enqueue(ctx, msg("t", "known", 1)); err != nil {
		t.Fatal(err)
	}
	if registered("known") {
		t.Fatal("an enqueue to a group the store saw registered probed the registry")
	}
	// In the caller's transaction, a group the store has not seen
	// committed is registered, and that teaches the store nothing.
	enqueueCommitted(msg("t", "in-tx", 0))
	unregister("in-tx")
	if _, err := ob.Enqueue(ctx, msg("t", "in-tx", 1)); err != nil {
		t.Fatal(err)
	}
	if !registered("in-tx") {
		t.Fatal("an enqueue in the caller's transaction taught the store its group")
	}

	// A claim teaches the store the groups of the messages it took.
	other, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, AppendOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.New[pgx.Tx](other, outbox.Options{}).Enqueue(ctx, msg("t", "claimed", 0)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 100, Owner: "p", Now: time.Now().Add(time.Second)}); err != nil || len(got) == 0 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	unregister("claimed")
	enqueueCommitted(msg("t", "claimed", 1))
	if registered("claimed") {
		t.Fatal("an enqueue to a group whose messages the store claimed probed the registry")
	}

	// Migrate forgets: a migration down past version 13 drops the
	// registry, and its way up fills it from the messages.
	if err := s.MigrateTo(ctx, 12); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	unregister("known")
	if _, err := ob.Enqueue(ctx, msg("t", "known", 2)); err != nil {
		t.Fatal(err)
	}
	if !registered("known") {
		t.Fatal("after Migrate, an enqueue skipped the registry")
	}
}

// On a single connection (a DB that lends none), an append-only claim runs
// its statements one by one in a transaction, and claims, leases and
// finishes as on a pool.
func TestAppendOnlyOnOneConnection(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 8)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	s, err := postgres.New(conn, postgres.Options{Schema: pg.Name, AppendOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.New[pgx.Tx](s, outbox.Options{}).Enqueue(ctx, msg("t", "g", 0), msg("t", "g", 1), msg("t", "h", 2)); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Second)
	got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: now})
	if err != nil || len(got) != 3 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	if again, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "q", Now: now}); err != nil || len(again) != 0 {
		t.Fatalf("second claim while leased: %d, %v", len(again), err)
	}
	var outs []outbox.Outcome
	for _, m := range got {
		outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
	}
	if res, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: now, Outcomes: outs}); err != nil || len(res.LeaseLost) > 0 {
		t.Fatalf("finish: %+v, %v", res, err)
	}
	c, err := s.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || c[outbox.StatusSent] != 3 {
		t.Fatalf("counts %v, %v; want 3 sent", c, err)
	}
}
