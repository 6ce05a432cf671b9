package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// storagePaths runs fn on the default path and on the append-only path,
// as subtests (fn may make them parallel).
func storagePaths(t *testing.T, fn func(t *testing.T, appendOnly bool)) {
	for _, ao := range []bool{false, true} {
		t.Run(fmt.Sprintf("AppendOnly=%v", ao), func(t *testing.T) { fn(t, ao) })
	}
}

// lateSent records ms as sent by owner with the claims they carry (an
// instance that lost its lease) and returns the IDs the fence refused.
func lateSent(ctx context.Context, t *testing.T, s outbox.Store, owner string, ms []outbox.Message) []string {
	t.Helper()
	p := outbox.MessageFinishParams{Owner: owner, Now: time.Now()}
	for _, m := range ms {
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "late-" + m.ID})
	}
	res, err := s.MessageFinish(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	return res.LeaseLost
}

// TestMessageRecoverOrphans: the leases a dead instance held go back to
// PENDING at once, however recent; a claim of the same owner (an instance
// restarted with the same ID) at the same attempt then takes them in
// group order, and the dead instance's late outcome is refused: only the
// claim token tells the two claims apart.
func TestMessageRecoverOrphans(t *testing.T) {
	storagePaths(t, func(t *testing.T, ao bool) {
		t.Parallel()
		b := setup(t, func(o *postgres.Options) { o.AppendOnly = ao })
		for n := range 4 {
			b.enqueue(msg("t", "g", n), msg("t", "", 100+n))
		}
		const owner = "a/db"
		dead := b.claim(owner, 5)
		if len(dead) == 0 {
			t.Fatal("nothing claimed")
		}
		res, err := b.store.MessageRecoverOrphans(b.ctx, outbox.MessageRecoverOrphansParams{Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Recovered != len(dead) || res.DeadLettered != 0 {
			t.Fatalf("recovered %+v, want %d recovered", res, len(dead))
		}
		b.wantPending(8)
		again := b.claim(owner, 100)
		if len(again) != 8 {
			t.Fatalf("claimed %d after the recovery, want 8", len(again))
		}
		var order []int
		attempt := map[string]int{}
		for _, m := range again {
			attempt[m.ID] = m.Attempts
			if m.Group == "g" {
				order = append(order, payloadN(t, m))
			}
		}
		if !slices.Equal(order, []int{0, 1, 2, 3}) {
			t.Fatalf("group g claimed in order %v", order)
		}
		for _, m := range dead {
			if attempt[m.ID] != m.Attempts {
				t.Fatalf("message %s: attempt %d after the recovery, %d before: the lost attempt was counted", m.ID, attempt[m.ID], m.Attempts)
			}
		}
		lost := lateSent(b.ctx, t, b.store, owner, dead)
		if !slices.Equal(slices.Sorted(slices.Values(lost)), slices.Sorted(slices.Values(ids(dead)))) {
			t.Fatalf("late outcome of the dead claims: refused %v, want all of %v", lost, ids(dead))
		}
		b.sent(owner, again...)
		cnt, err := b.store.MessageCount(b.ctx, outbox.MessageCountParams{})
		if err != nil || cnt[outbox.StatusSent] != 8 {
			t.Fatalf("count = %v, %v, want 8 sent", cnt, err)
		}
		for _, m := range dead {
			got, err := b.store.MessageGet(b.ctx, outbox.MessageGetParams{ID: m.ID})
			if err != nil || got.ProviderMessageID != "p-"+m.ID {
				t.Fatalf("message %s: provider ID %q (%v): the late outcome was applied", m.ID, got.ProviderMessageID, err)
			}
		}
	})
}

// TestFleetRecoversOrphans: instance "a" takes a database's lease, claims
// messages, publishes the first of them and dies without an outcome.
// Instance "b" takes the database when a's lease expires and publishes
// every message, the claimed ones included, with ProcessingTimeout and
// the recovery interval an hour: their leases were given back when b took
// the database. Group order holds, the only duplicate is the one a had in
// flight, and a's late outcomes are refused.
func TestFleetRecoversOrphans(t *testing.T) {
	storagePaths(t, func(t *testing.T, ao bool) {
		pg, ctx, leaser := fleetSetup(t, 4, 2*time.Minute)
		db := pg.Name + "_orphans"
		store, err := postgres.New(pg.Pool, postgres.Options{Schema: db, AppendOnly: ao})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = pg.Pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+db+" CASCADE")
		})
		ob := outbox.New[pgx.Tx](store, outbox.Options{})
		const perGroup = 5
		for n := range perGroup {
			for _, g := range []string{"g0", "g1"} {
				if _, err := ob.Enqueue(ctx, msg("t", g, n)); err != nil {
					t.Fatal(err)
				}
			}
		}

		// Instance a: its lease, its claim, one message published, death.
		const ttl = time.Second
		la, err := leaser.ShardAcquire(ctx, outbox.ShardAcquireParams{Member: "a", Shards: []string{db}, TTL: ttl})
		if err != nil || len(la) != 1 {
			t.Fatalf("a's lease: %v, %v", la, err)
		}
		dead, err := store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 6, Owner: "a/" + db, Now: time.Now()})
		if err != nil || len(dead) == 0 {
			t.Fatalf("a's claim: %d messages, %v", len(dead), err)
		}
		log := &fleetLog{}
		log.mu.Lock()
		log.pubs = append(log.pubs, fleetPub{db: db, member: "a", epoch: la[0].Epoch, id: dead[0].ID, group: dead[0].Group, n: payloadN(t, dead[0]), at: time.Now()})
		log.mu.Unlock()

		pool, err := pgxpool.New(ctx, pg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		f, err := outbox.NewFleet(outbox.FleetConfig{
			ID: "b", Databases: outbox.StaticDatabases(db), Leaser: leaser, LeaseTTL: ttl, Publisher: log.publisher(t, "b"),
			Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
				s, err := postgres.New(pool, postgres.Options{Schema: db, AppendOnly: ao})
				return outbox.ShardStore{Store: s}, err
			},
			Processor: outbox.Config{AllTopics: true, PollInterval: 50 * time.Millisecond, ProcessingTimeout: time.Hour, RecoveryInterval: time.Hour},
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := runFleet(t, ctx, f)
		log.await(t, 2*perGroup+1, time.Minute)
		stop()
		if dups := log.check(t, map[string]int{db: 2 * perGroup}); dups != 1 {
			t.Fatalf("%d published twice, want 1 (a's message in flight)", dups)
		}
		if lost := lateSent(ctx, t, store, "a/"+db, dead); len(lost) != len(dead) {
			t.Fatalf("a's late outcomes: %d of %d refused", len(lost), len(dead))
		}
		cnt, err := store.MessageCount(ctx, outbox.MessageCountParams{})
		if err != nil || cnt[outbox.StatusSent] != 2*perGroup {
			t.Fatalf("count = %v, %v, want %d sent", cnt, err, 2*perGroup)
		}
	})
}
