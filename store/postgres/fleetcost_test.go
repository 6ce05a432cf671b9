package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// roundTrips is a pgx tracer that keeps what a pool sends: each query or
// batch (one round trip) with the statement it runs (a batch's last), and
// each connection opened.
type roundTrips struct {
	mu  sync.Mutex
	all []roundTrip
}

type roundTrip struct {
	at  time.Time
	sql string // "" for a connection
}

func (r *roundTrips) add(sql string) {
	r.mu.Lock()
	r.all = append(r.all, roundTrip{time.Now(), sql})
	r.mu.Unlock()
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if q := d.Batch.QueuedQueries; len(q) > 0 {
		r.add(q[len(q)-1].SQL)
	}
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (r *roundTrips) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	r.add("")
	return ctx
}

func (r *roundTrips) TraceConnectEnd(context.Context, pgx.TraceConnectEndData) {}

// count returns, of what was sent from from to to, the connections opened,
// the round trips naming one of dbs, and the others.
func (r *roundTrips) count(from, to time.Time, dbs []string) (conns, named, other int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, q := range r.all {
		switch {
		case q.at.Before(from) || q.at.After(to):
		case q.sql == "":
			conns++
		case slices.ContainsFunc(dbs, func(db string) bool { return strings.Contains(q.sql, db) }):
			named++
		default:
			other++
		}
	}
	return conns, named, other
}

// TestFleetStartCost: what starting a database costs a fleet on
// PostgreSQL, in round trips to the server, and that the start's first
// store call is its first claim: the processor's start-up probe (a
// one-message list) is left out in a fleet, the claim failing as it would
// (TestFleetNotMigrated). Figures are logged: per database, its start, and
// then per second idle.
func TestFleetStartCost(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 4, time.Minute)
	const n = 4
	dbs, outboxes := fleetDatabases(ctx, t, pg, n)
	for _, db := range dbs {
		if _, err := outboxes[db].Enqueue(ctx, msg("t", "g", 0)); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	watch := &startWatch{}
	log := &fleetLog{}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: 2 * time.Second,
		Publisher: log.publisher(t, "solo"),
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pool, postgres.Options{Schema: db})
			if err != nil {
				return outbox.ShardStore{}, err
			}
			watch.open(db)
			return outbox.ShardStore{Store: &startWatchStore{Store: s, w: watch, db: db}}, nil
		},
		Processor: outbox.Config{AllTopics: true, PollInterval: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := runFleet(t, ctx, f)
	log.await(t, n, 30*time.Second)
	published := time.Now()
	const idle = 4 * time.Second
	time.Sleep(idle)
	stop()
	log.check(t, map[string]int{dbs[0]: 1, dbs[1]: 1, dbs[2]: 1, dbs[3]: 1})

	// The start: to a second after every database published (its
	// listener is up by then: no database is starting).
	from := published.Add(time.Second)
	conns, named, other := trips.count(start, from, dbs)
	t.Logf("per database, its start (every database published %s after the fleet started, and a second more): %.1f round trips naming it, %.1f others (the listener's), %.1f connections opened",
		published.Sub(start).Round(time.Millisecond), float64(named)/n, float64(other)/n, float64(conns)/n)
	conns, named, other = trips.count(from, from.Add(idle-time.Second), dbs)
	secs := (idle - time.Second).Seconds()
	t.Logf("per database and second idle (PollInterval 1s, LISTEN): %.2f round trips naming it, %.2f others, %.2f connections opened",
		float64(named)/n/secs, float64(other)/n/secs, float64(conns)/n/secs)

	watch.mu.Lock()
	defer watch.mu.Unlock()
	if len(watch.early) > 0 {
		t.Errorf("asked for before the database's first claim returned: %v", watch.early)
	}
}

// TestFleetNotMigrated: a database whose tables are missing does not
// start (its status says to migrate it), though no probe precedes its
// first claim, and starts once migrated.
func TestFleetNotMigrated(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 4, time.Minute)
	db := pg.Name + "_bare"
	t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+db+" CASCADE") })
	store, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
	if err != nil {
		t.Fatal(err)
	}
	log := &fleetLog{}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", Databases: outbox.StaticDatabases(db), Leaser: leaser, LeaseTTL: time.Second,
		Publisher: log.publisher(t, "solo"),
		Open: func(context.Context, string) (outbox.ShardStore, error) {
			return outbox.ShardStore{Store: store}, nil
		},
		Processor: outbox.Config{AllTopics: true, PollInterval: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer runFleet(t, ctx, f)()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := f.Status().Shards
		if len(st) == 1 && st[0].Err != nil {
			if !errors.Is(st[0].Err, outbox.ErrNotMigrated) {
				t.Fatalf("a database without tables: %v; want an error matching ErrNotMigrated", st[0].Err)
			}
			if st[0].Health.Running {
				t.Fatalf("a database without tables runs: %+v", st[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a database without tables reports no error: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New[pgx.Tx](store, outbox.Options{})
	if _, err := ob.Enqueue(ctx, msg("t", "g", 0)); err != nil {
		t.Fatal(err)
	}
	log.await(t, 1, 30*time.Second)
	if st := f.Status().Shards; len(st) != 1 || st[0].Err != nil || !st[0].Health.Running {
		t.Fatalf("once migrated: %s", fmt.Sprint(st))
	}
}
