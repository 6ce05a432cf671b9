package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/testbackend"
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

// tracedFleet makes n fleet databases (fleetDatabases) with a message
// enqueued in each, and a pool (tune changes its config, when not nil)
// whose round trips trips keeps, closed when t ends.
func tracedFleet(ctx context.Context, t *testing.T, pg testbackend.PostgresSchema, n int, tune func(*pgxpool.Config)) (dbs []string, pool *pgxpool.Pool, trips *roundTrips) {
	t.Helper()
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
	if tune != nil {
		tune(cfg)
	}
	trips = &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return dbs, pool, trips
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
	dbs, pool, trips := tracedFleet(ctx, t, pg, n, nil)
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
	// 7 the processor's (the store's settings and tables checked, its
	// first claim, outcome and recovery) and 5 the listener's (LISTEN with
	// its name, the self-test's NOTIFY, the sequence found and read, the
	// notify lock tried). LISTEN and its name were two.
	if named+other > 12*n {
		t.Errorf("a database started with %.1f round trips, want at most 12", float64(named+other)/n)
	}
	conns, named, other = trips.count(from, from.Add(idle-time.Second), dbs)
	secs := (idle - time.Second).Seconds()
	t.Logf("per database and second idle (PollInterval 1s, IdlePollInterval the fleet's 1m, LISTEN): %.2f round trips naming it, %.2f others, %.2f connections opened",
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

// backendCPU returns the CPU time (user and system) the server's backends
// pids used so far, read from /proc (the server runs on this machine).
func backendCPU(t *testing.T, pids []int32) time.Duration {
	t.Helper()
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // the backend exited
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th of them.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		for _, s := range f[11:13] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// TestFleetIdleCost measures what idle databases cost a fleet on
// PostgreSQL (OUTBOXKIT_FLEET_IDLE_TEST=1; OUTBOXKIT_FLEET_DATABASES, 50,
// and OUTBOXKIT_FLEET_IDLE_SECONDS, 60, change its size): one instance
// serves the databases, all published once and idle since, and the test
// counts, over the window, the round trips each database's processor and
// listener send and the CPU time of the server backends that answer them.
// OUTBOXKIT_FLEET_IDLE_POLL sets the processors' IdlePollInterval (the
// fleet's default otherwise). It fails when a database costs more than the
// issue's bound, one query per PollInterval.
func TestFleetIdleCost(t *testing.T) {
	if os.Getenv("OUTBOXKIT_FLEET_IDLE_TEST") != "1" {
		t.Skip("set OUTBOXKIT_FLEET_IDLE_TEST=1 to measure the idle cost of a fleet's databases")
	}
	n, secs := 50, 60
	if v, err := strconv.Atoi(os.Getenv("OUTBOXKIT_FLEET_DATABASES")); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("OUTBOXKIT_FLEET_IDLE_SECONDS")); err == nil {
		secs = v
	}
	window := time.Duration(secs) * time.Second
	// OUTBOXKIT_FLEET_IDLE_POLL sets Processor.IdlePollInterval (1s: as
	// before it existed).
	idlePoll, _ := time.ParseDuration(os.Getenv("OUTBOXKIT_FLEET_IDLE_POLL"))
	pg, ctx, leaser := fleetSetup(t, 4, window+2*time.Minute)
	app := "idlecost " + pg.Name
	dbs, pool, trips := tracedFleet(ctx, t, pg, n, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 8
	})
	const poll = time.Second
	log := &fleetLog{}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: 2 * time.Second,
		MaxStoreCalls: 8, Publisher: log.publisher(t, "solo"),
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pool, postgres.Options{Schema: db})
			return outbox.ShardStore{Store: s}, err
		},
		Processor: outbox.Config{AllTopics: true, PollInterval: poll, IdlePollInterval: idlePoll},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runFleet(t, ctx, f)
	log.await(t, n, time.Minute)
	// Every listener is up 4 x LeaseTTL after the last first claim at the
	// latest.
	time.Sleep(10 * time.Second)
	backends := func(name string) []int32 {
		rows, err := pg.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1`, name)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	pids, lpids := backends(app), backends("outboxkit listener "+pg.Name+"%")
	from, cpu0, lcpu0 := time.Now(), backendCPU(t, pids), backendCPU(t, lpids)
	time.Sleep(window)
	to, cpu1, lcpu1 := time.Now(), backendCPU(t, pids), backendCPU(t, lpids)
	stop()
	log.check(t, func() map[string]int {
		m := map[string]int{}
		for _, db := range dbs {
			m[db] = 1
		}
		return m
	}())
	conns, named, other := trips.count(from, to, dbs)
	per := float64(n) * to.Sub(from).Seconds()
	cpu, lcpu := cpu1-cpu0, lcpu1-lcpu0
	t.Logf("%d idle databases (IdlePollInterval %s), %s: per database and second %.3f round trips naming it (claims, recoveries), %.3f others, %.3f connections opened; "+
		"server CPU per database and minute: %.1f ms in the %d pool backends (%.0f µs per round trip), %.1f ms in the %d listeners' (signalled by every NOTIFY in the database, anyone's)",
		n, idlePoll, to.Sub(from).Round(time.Second), float64(named)/per, float64(other)/per, float64(conns)/per,
		float64(cpu.Microseconds())/1000/per*60, len(pids), float64(cpu.Microseconds())/max(float64(named+other), 1),
		float64(lcpu.Microseconds())/1000/per*60, len(lpids))
	if q := float64(named+other) / per; q > 1/poll.Seconds() {
		t.Errorf("an idle database costs %.2f queries a second, more than one per PollInterval (%s)", q, poll)
	}
}

// claimCounter is a database's store that counts its claims.
type claimCounter struct {
	*postgres.Store
	claims atomic.Int64
}

func (c *claimCounter) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	c.claims.Add(1)
	return c.Store.MessageClaim(ctx, p)
}

// TestFleetIdleWakeups: a fleet's idle database whose LISTEN is up is
// claimed every IdlePollInterval, not every PollInterval; what is enqueued
// there is still published at once (the wake-up), a stuck message is
// still recovered and published, while its listener is lost the database
// is polled every PollInterval again, until it is back, and a retry is
// claimed when it is due.
func TestFleetIdleWakeups(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 4, 2*time.Minute)
	dbs, outboxes := fleetDatabases(ctx, t, pg, 2)
	idle, stuck := dbs[0], dbs[1]
	const (
		poll = 200 * time.Millisecond
		pt   = time.Second
	)
	// A message of the stuck database claimed by a processor that died,
	// its lease expiring in 6 s (the fleet idles by then).
	stuckStore, err := postgres.New(pg.Pool, postgres.Options{Schema: stuck})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outboxes[stuck].Enqueue(ctx, msg("t", "g", 0)); err != nil {
		t.Fatal(err)
	}
	if ms, err := stuckStore.MessageClaim(ctx, outbox.MessageClaimParams{Owner: "dead", Limit: 1, Now: time.Now().Add(5 * time.Second)}); err != nil || len(ms) != 1 {
		t.Fatalf("claimed %d messages as the dead processor: %v", len(ms), err)
	}
	var blocked atomic.Bool
	stores := map[string]*claimCounter{}
	var mu sync.Mutex
	log := &fleetLog{}
	// Message 10 fails once, to be retried a second later.
	inner := log.publisher(t, "solo")
	var failed atomic.Bool
	pub := outbox.PublisherFunc(func(ctx context.Context, ms []outbox.Message) []outbox.Result {
		for i, m := range ms {
			if payloadN(t, m) == 10 && failed.CompareAndSwap(false, true) {
				res := inner.Publish(ctx, ms[:i])
				res = append(res, outbox.Result{Err: errors.New("not now")})
				for range ms[i+1:] {
					res = append(res, outbox.Result{Err: outbox.ErrNotAttempted})
				}
				return res
			}
		}
		return inner.Publish(ctx, ms)
	})
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: time.Second,
		Publisher: pub,
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: db, Connect: func(ctx context.Context) (*pgx.Conn, error) {
				if blocked.Load() {
					return nil, errors.New("the test keeps the listener out")
				}
				return pgx.Connect(ctx, pg.DSN)
			}})
			if err != nil {
				return outbox.ShardStore{}, err
			}
			c := &claimCounter{Store: s}
			mu.Lock()
			stores[db] = c
			mu.Unlock()
			return outbox.ShardStore{Store: c}, nil
		},
		Processor: outbox.Config{AllTopics: true, PollInterval: poll, IdlePollInterval: time.Minute,
			ProcessingTimeout: pt, RecoveryInterval: 300 * time.Millisecond, Backoff: outbox.Backoff{Schedule: []time.Duration{time.Second}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer runFleet(t, ctx, f)()
	claimsIn := func(db string, d time.Duration) int64 {
		mu.Lock()
		c := stores[db]
		mu.Unlock()
		before := c.claims.Load()
		time.Sleep(d)
		return c.claims.Load() - before
	}
	published := func(n int, what string) time.Duration {
		t.Helper()
		start := time.Now()
		log.await(t, n, 10*time.Second)
		took := time.Since(start)
		t.Logf("%s: published %s later", what, took.Round(time.Millisecond))
		return took
	}
	enqueue := func(n int) time.Time {
		if _, err := outboxes[idle].Enqueue(ctx, msg("t", "g", n)); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	// Idle, listening: the wake-ups begin once the databases started.
	enqueue(0)
	published(1, "first message")
	time.Sleep(time.Second)
	if n := claimsIn(idle, 2*time.Second); n > 1 {
		t.Errorf("an idle database with its listener up was claimed %d times in 2 s (PollInterval %s, IdlePollInterval 1m)", n, poll)
	}
	enqueue(1)
	if took := published(2, "a message enqueued in the idle database"); took > 2*time.Second {
		t.Errorf("a message enqueued in an idle database was published %s later: the wake-up did not come", took)
	}
	// The stuck message's lease expires 6 s after the test began; the
	// recovery every 300 ms gives it back and the processor publishes it.
	if took := published(3, "the stuck message"); took > 9*time.Second {
		t.Errorf("the stuck message was published %s later", took)
	}
	// The listener lost and kept out: polling every PollInterval.
	blocked.Store(true)
	if _, err := pg.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE $1`,
		"outboxkit listener "+idle+".%"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := claimsIn(idle, 2*time.Second); n < 4 {
		t.Errorf("an idle database whose listener was lost was claimed %d times in 2 s (PollInterval %s): it does not poll", n, poll)
	}
	enqueue(2)
	if took := published(4, "a message enqueued while the listener is lost"); took > 2*time.Second {
		t.Errorf("a message enqueued while the listener was lost was published %s later", took)
	}
	// The listener back (it retries within 10 s): idle again.
	blocked.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for claimsIn(idle, 2*time.Second) > 1 {
		if time.Now().After(deadline) {
			t.Fatal("the database still polls 20 s after its listener could connect again")
		}
	}
	enqueue(3)
	if took := published(5, "a message enqueued once the listener is back"); took > 2*time.Second {
		t.Errorf("a message enqueued once the listener was back was published %s later", took)
	}
	// A retry a second later: the processor wakes for it.
	enqueue(10)
	if took := published(6, "a message retried 1 s after it failed"); took > 3*time.Second {
		t.Errorf("a message retried 1 s after it failed was published %s later: the processor did not wake for it", took)
	}
}
