package postgres_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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

// fleetPub is one publication seen by a fleet test's publisher.
type fleetPub struct {
	db, member string
	epoch      int64
	id         string
	group      string
	n          int
	at         time.Time
}

// fleetLog records the publications of every instance of a fleet test.
type fleetLog struct {
	mu   sync.Mutex
	pubs []fleetPub
}

func (l *fleetLog) publisher(t *testing.T, member string) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, ms []outbox.Message) []outbox.Result {
		sh, ok := outbox.ShardFromContext(ctx)
		if !ok {
			t.Error("Publish's context carries no shard lease")
		}
		now := time.Now()
		l.mu.Lock()
		res := make([]outbox.Result, len(ms))
		for i, m := range ms {
			l.pubs = append(l.pubs, fleetPub{db: sh.Shard, member: member, epoch: sh.Epoch, id: m.ID, group: m.Group, n: payloadN(t, m), at: now})
			res[i] = outbox.Result{ProviderMessageID: "p-" + m.ID}
		}
		l.mu.Unlock()
		return res
	})
}

// await waits until n publications were seen, for up to timeout.
func (l *fleetLog) await(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		published := len(l.pubs)
		l.mu.Unlock()
		if published >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages published", published, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check verifies what a fleet must keep: every message published, FIFO per
// group (first publications in enqueue order), and in each database the
// leases one after the other: no publication under an epoch after a
// publication under a later one. It returns the duplicates.
func (l *fleetLog) check(t *testing.T, enqueued map[string]int) (dups int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	type key struct{ db, group string }
	seen := map[string]bool{}
	next := map[key]int{}
	maxEpoch := map[string]fleetPub{}
	for _, p := range l.pubs {
		if last, ok := maxEpoch[p.db]; ok && p.epoch < last.epoch {
			t.Fatalf("database %s: %s published under epoch %d after %s published under epoch %d", p.db, p.member, p.epoch, last.member, last.epoch)
		}
		maxEpoch[p.db] = p
		if seen[p.id] {
			dups++
			continue
		}
		seen[p.id] = true
		k := key{p.db, p.group}
		if p.n != next[k] {
			t.Fatalf("database %s group %s: message %d published first while %d was next", p.db, p.group, p.n, next[k])
		}
		next[k]++
	}
	for db, n := range enqueued {
		got := 0
		for k, v := range next {
			if k.db == db {
				got += v
			}
		}
		if got != n {
			t.Fatalf("database %s: %d of %d messages published", db, got, n)
		}
	}
	return dups
}

// deadLeaser is a ShardLeaser whose instance can be made unreachable: every
// call fails once dead is set, as for an instance cut off from the
// coordination database.
type deadLeaser struct {
	outbox.ShardLeaser
	dead atomic.Bool
}

var errCutOff = errors.New("cut off")

func (d *deadLeaser) ShardAcquire(ctx context.Context, p outbox.ShardAcquireParams) ([]outbox.ShardLease, error) {
	if d.dead.Load() {
		return nil, errCutOff
	}
	return d.ShardLeaser.ShardAcquire(ctx, p)
}

func (d *deadLeaser) ShardList(ctx context.Context, p outbox.ShardListParams) ([]outbox.ShardLease, error) {
	if d.dead.Load() {
		return nil, errCutOff
	}
	return d.ShardLeaser.ShardList(ctx, p)
}

func (d *deadLeaser) ShardMembers(ctx context.Context, p outbox.ShardMembersParams) ([]string, error) {
	if d.dead.Load() {
		return nil, errCutOff
	}
	return d.ShardLeaser.ShardMembers(ctx, p)
}

func (d *deadLeaser) ShardRelease(ctx context.Context, p outbox.ShardReleaseParams) error {
	if d.dead.Load() {
		return errCutOff
	}
	return d.ShardLeaser.ShardRelease(ctx, p)
}

func (d *deadLeaser) ShardRenew(ctx context.Context, p outbox.ShardRenewParams) ([]outbox.ShardLease, error) {
	if d.dead.Load() {
		return nil, errCutOff
	}
	return d.ShardLeaser.ShardRenew(ctx, p)
}

// fleetSetup begins a parallel fleet test: a pool of up to conns
// connections and a schema on the test server, a context that ends after
// timeout (or with the test), and a ShardLeaser migrated in the schema.
func fleetSetup(t *testing.T, conns int32, timeout time.Duration) (testbackend.PostgresSchema, context.Context, *postgres.ShardLeaser) {
	t.Helper()
	t.Parallel()
	pg := testbackend.Postgres(t, conns)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return pg, ctx, migratedLeaser(ctx, t, pg.Pool, pg.Name)
}

// runFleet runs f until the stop it returns is called, which waits for
// Run to return and fails t on its error.
func runFleet(t *testing.T, ctx context.Context, f *outbox.Fleet) (stop func()) {
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// migratedLeaser returns a ShardLeaser with its tables in schema.
func migratedLeaser(ctx context.Context, t *testing.T, db postgres.DB, schema string) *postgres.ShardLeaser {
	t.Helper()
	leaser, err := postgres.NewShardLeaser(db, postgres.ShardLeaserOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaser.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return leaser
}

// waitShares waits until the fleets serve exactly want databases each (in
// order), and returns how long that took.
func waitShares(t *testing.T, what string, timeout time.Duration, fleets []*outbox.Fleet, want ...int) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := make([]int, len(fleets))
		for i, f := range fleets {
			for _, s := range f.Status().Shards {
				if !s.Stopping && s.Err == nil && s.Health.Running {
					got[i]++
				}
			}
		}
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: the fleets serve %v databases, want %v", what, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fleetDatabases makes n migrated outboxes in schemas of pg standing in
// for a fleet's databases, dropped when t ends, and returns their names
// and outboxes.
func fleetDatabases(ctx context.Context, t *testing.T, pg testbackend.PostgresSchema, n int) ([]string, map[string]*outbox.Outbox[pgx.Tx]) {
	t.Helper()
	var dbs []string
	outboxes := map[string]*outbox.Outbox[pgx.Tx]{}
	for i := range n {
		name := fmt.Sprintf("%s_db%d", pg.Name, i)
		s, err := postgres.New(pg.Pool, postgres.Options{Schema: name})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c, err := pgx.Connect(ctx, pg.DSN); err == nil {
				_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE")
				_ = c.Close(ctx)
			}
		})
		dbs = append(dbs, name)
		outboxes[name] = outbox.New[pgx.Tx](s, outbox.Options{})
	}
	return dbs, outboxes
}

// TestFleet runs fleets over 8 outboxes (schemas standing in for databases)
// while messages are enqueued into each: a second instance takes half,
// an instance that leaves hands its share back at once, and the shares of
// an instance cut off from the coordination database move once its
// leases expire, it having stopped its processors before. Nothing is lost,
// FIFO holds per group, and each database's leases never overlap.
func TestFleet(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 8, 3*time.Minute)
	dbs, outboxes := fleetDatabases(ctx, t, pg, 8)

	log := &fleetLog{}
	type instance struct {
		fleet  *outbox.Fleet
		leaser *deadLeaser
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(id string) *instance {
		pool, err := pgxpool.New(ctx, pg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		dl := &deadLeaser{ShardLeaser: leaser}
		f, err := outbox.NewFleet(outbox.FleetConfig{
			ID: id, Databases: outbox.StaticDatabases(dbs...), Leaser: dl, LeaseTTL: 2 * time.Second,
			MaxStoreCalls: 4, Publisher: log.publisher(t, id),
			Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
				s, err := postgres.New(pool, postgres.Options{Schema: db})
				return outbox.ShardStore{Store: s}, err
			},
			Processor: outbox.Config{AllTopics: true, PollInterval: 100 * time.Millisecond, ProcessingTimeout: 3 * time.Second, RecoveryInterval: 200 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		fctx, fcancel := context.WithCancel(ctx)
		in := &instance{fleet: f, leaser: dl, cancel: fcancel, done: make(chan struct{})}
		go func() {
			defer close(in.done)
			defer pool.Close()
			if err := f.Run(fctx); err != nil {
				t.Error(err)
			}
		}()
		return in
	}
	stop := func(in *instance) { in.cancel(); <-in.done }

	// Producers: one message every few milliseconds into a database and
	// group in turn.
	var (
		mu       sync.Mutex
		enqueued = map[string]int{}
		counter  = map[string]int{}
		halt     atomic.Bool
		prod     sync.WaitGroup
	)
	prod.Add(1)
	go func() {
		defer prod.Done()
		for i := 0; !halt.Load(); i++ {
			db := dbs[i%len(dbs)]
			group := fmt.Sprintf("g%d", (i/len(dbs))%3)
			mu.Lock()
			n := counter[db+"/"+group]
			mu.Unlock()
			if _, err := outboxes[db].Enqueue(ctx, msg("t", group, n)); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			counter[db+"/"+group]++
			enqueued[db]++
			mu.Unlock()
			time.Sleep(3 * time.Millisecond)
		}
	}()

	a := start("a")
	waitShares(t, "one instance", 20*time.Second, []*outbox.Fleet{a.fleet}, 8)
	b := start("b")
	took := waitShares(t, "a second instance joins", 20*time.Second, []*outbox.Fleet{a.fleet, b.fleet}, 4, 4)
	t.Logf("a second instance had its share %s after it started", took.Round(time.Millisecond))
	stop(b)
	took = waitShares(t, "the second instance leaves", 20*time.Second, []*outbox.Fleet{a.fleet}, 8)
	t.Logf("the remaining instance served everything %s after the other left", took.Round(time.Millisecond))

	c := start("c")
	waitShares(t, "a third instance joins", 20*time.Second, []*outbox.Fleet{a.fleet, c.fleet}, 4, 4)
	// a is cut off from the coordination database: it must stop its
	// processors before its leases can expire; c takes them after.
	a.leaser.dead.Store(true)
	cutAt := time.Now()
	waitShares(t, "the cut-off instance stops", 10*time.Second, []*outbox.Fleet{a.fleet}, 0)
	stopped := time.Since(cutAt)
	took = waitShares(t, "the cut-off instance's share moves", 20*time.Second, []*outbox.Fleet{c.fleet}, 8)
	t.Logf("cut off: its processors stopped %s after, and its share was served again %s after (lease TTL 2s)",
		stopped.Round(time.Millisecond), (stopped + took).Round(time.Millisecond))
	if st := a.fleet.Status(); st.LeaseErr == nil {
		t.Fatal("the cut-off instance reports no leaser error")
	}

	halt.Store(true)
	prod.Wait()
	deadline := time.Now().Add(time.Minute)
	for {
		done := true
		for _, s := range c.fleet.Status().Shards {
			if s.Progress.InFlight > 0 {
				done = false
			}
		}
		mu.Lock()
		total := 0
		for _, n := range enqueued {
			total += n
		}
		mu.Unlock()
		log.mu.Lock()
		ids := map[string]bool{}
		for _, p := range log.pubs {
			ids[p.id] = true
		}
		log.mu.Unlock()
		if done && len(ids) == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages published", len(ids), total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop(c)
	stop(a)
	dups := log.check(t, enqueued)
	mu.Lock()
	total := 0
	for _, n := range enqueued {
		total += n
	}
	mu.Unlock()
	t.Logf("%d messages over %d databases, %d published twice", total, len(dbs), dups)

	// Every instance left or was cut off: the stopped ones hold nothing.
	leases, err := leaser.ShardList(ctx, outbox.ShardListParams{})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(leases, func(x, y outbox.ShardLease) int { return cmp.Compare(x.Shard, y.Shard) })
	for _, l := range leases {
		if l.Owner == "c" && !l.Expired {
			t.Fatalf("lease of %s still held by c after it stopped", l.Shard)
		}
	}
}

// TestFleetFollowsDatabaseList: a database added to the list is served at
// the next listing, and one removed is stopped and its lease released.
func TestFleetFollowsDatabaseList(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 8, time.Minute)
	var mu sync.Mutex
	listed := []string{pg.Name + "_x", pg.Name + "_y"}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", LeaseTTL: time.Second, RefreshInterval: 100 * time.Millisecond, Leaser: leaser,
		Databases: func(context.Context) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(listed), nil
		},
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
			if err != nil {
				return outbox.ShardStore{}, err
			}
			return outbox.ShardStore{Store: s}, s.Migrate(ctx)
		},
		Publisher: outbox.PublishEach(func(context.Context, outbox.Message) outbox.Result { return outbox.Result{} }),
		Processor: outbox.Config{AllTopics: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"_x", "_y", "_z"} {
		t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pg.Name+s+" CASCADE") })
	}
	stop := runFleet(t, ctx, f)
	serving := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var got []string
			for _, s := range f.Status().Shards {
				name := strings.TrimPrefix(s.Database, pg.Name)
				if !s.Health.Running || s.Stopping {
					name += " (not running)" // a stopping shard's lease is released once it is gone
				}
				got = append(got, name)
			}
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("serving %v, want %v", got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	serving("_x", "_y")
	mu.Lock()
	listed = []string{pg.Name + "_y", pg.Name + "_z"}
	mu.Unlock()
	serving("_y", "_z")
	leases, err := leaser.ShardList(ctx, outbox.ShardListParams{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Shard == pg.Name+"_x" && !l.Expired {
			t.Fatalf("the lease of a database no longer listed is still held: %+v", l)
		}
	}
	stop()
}

// TestShardLeaseExpiresAt: a lease taken or renewed tells when it runs
// out, by the database's clock; a released one tells nothing.
func TestShardLeaseExpiresAt(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 2, time.Minute)
	var before time.Time
	if err := pg.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	got, err := leaser.ShardAcquire(ctx, outbox.ShardAcquireParams{Member: "m", Shards: []string{"s"}, TTL: time.Hour})
	if err != nil || len(got) != 1 {
		t.Fatalf("acquire: %+v, %v", got, err)
	}
	if exp := got[0].ExpiresAt; exp.Before(before.Add(time.Hour)) || exp.After(before.Add(time.Hour+time.Minute)) {
		t.Errorf("acquired at %s for an hour: expires at %s", before, exp)
	}
	renewed, err := leaser.ShardRenew(ctx, outbox.ShardRenewParams{Member: "m", Shards: []string{"s"}, TTL: 2 * time.Hour})
	if err != nil || len(renewed) != 1 || !renewed[0].ExpiresAt.After(got[0].ExpiresAt) {
		t.Fatalf("renewed for 2 hours: %+v, %v; want a later expiry than %s", renewed, err, got[0].ExpiresAt)
	}
	list, err := leaser.ShardList(ctx, outbox.ShardListParams{})
	if err != nil || len(list) != 1 || !list[0].ExpiresAt.Equal(renewed[0].ExpiresAt) || list[0].Expired {
		t.Fatalf("list: %+v, %v; want the renewed lease", list, err)
	}
	if err := leaser.ShardRelease(ctx, outbox.ShardReleaseParams{Member: "m", Shards: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	list, err = leaser.ShardList(ctx, outbox.ShardListParams{})
	if err != nil || len(list) != 1 || !list[0].Expired || !list[0].ExpiresAt.IsZero() {
		t.Fatalf("after the release: %+v, %v; want it expired with no expiry time", list, err)
	}
}

// startWatchStore is a database's store in TestFleetStartsInTurn: it
// records when the fleet opened it, when its first claim returned, and
// whether a probe (a one-message list), lease recovery or wake-ups were
// asked for before that.
type startWatchStore struct {
	*postgres.Store
	w  *startWatch
	db string

	mu      sync.Mutex
	claimed bool
}

// startWatch is what TestFleetStartsInTurn observes of every database's
// start.
type startWatch struct {
	mu          sync.Mutex
	opened      []string // in order
	starting    int      // opened, first claim not returned yet
	maxStarting int
	early       []string // a probe, recovery or wake-ups asked for before the first claim returned
}

func (w *startWatch) open(db string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.opened = append(w.opened, db)
	w.starting++
	w.maxStarting = max(w.maxStarting, w.starting)
}

func (s *startWatchStore) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	ms, err := s.Store.MessageClaim(ctx, p)
	s.mu.Lock()
	first := !s.claimed
	s.claimed = true
	s.mu.Unlock()
	if first {
		s.w.mu.Lock()
		s.w.starting--
		s.w.mu.Unlock()
	}
	return ms, err
}

func (s *startWatchStore) checkClaimed(what string) {
	s.mu.Lock()
	claimed := s.claimed
	s.mu.Unlock()
	if !claimed {
		s.w.mu.Lock()
		s.w.early = append(s.w.early, s.db+": "+what)
		s.w.mu.Unlock()
	}
}

func (s *startWatchStore) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	s.checkClaimed("probe")
	return s.Store.MessageList(ctx, p)
}

func (s *startWatchStore) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	s.checkClaimed("recovery")
	return s.Store.MessageRecover(ctx, p)
}

func (s *startWatchStore) Wakeups(ctx context.Context) <-chan struct{} {
	s.checkClaimed("wake-ups")
	return s.Store.Wakeups(ctx)
}

// TestFleetStartsInTurn: the databases of a member that died are taken as
// their leases expire (not up to a renewal period later) and start in
// turn, MaxStarting at a time, those whose leases expired first before the
// others; a database's lease recovery and wake-ups wait for its first
// claim, which no probe precedes (it is the probe). Unbounded, a dead member's few dozen databases all started at
// once on the instance that took them, and their first claims queued
// behind each other's opening calls in the fleet's store-call budget,
// long enough on a busy machine for the processor to count the claimed
// leases as expired and leave the messages to recovery.
func TestFleetStartsInTurn(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 16, 2*time.Minute)
	const n = 10
	dbs, outboxes := fleetDatabases(ctx, t, pg, n)
	for _, db := range dbs {
		if _, err := outboxes[db].Enqueue(ctx, msg("t", "g", 0), msg("t", "g", 1)); err != nil {
			t.Fatal(err)
		}
	}

	// A member that died held every database; its leases expire one after
	// the other, in an order that is neither the names' nor the new
	// instance's preference, between two of its renewal rounds (every 4 s
	// with a 20 s LeaseTTL: its first round at once only joins, its second
	// finds every lease live, its third comes 2.1-2.5 s after they expired).
	const ttl = 20 * time.Second
	order := []int{3, 7, 0, 9, 5, 1, 8, 2, 6, 4}
	expires := map[string]time.Time{}
	var want []string
	for k, i := range order {
		got, err := leaser.ShardAcquire(ctx, outbox.ShardAcquireParams{Member: "dead", Shards: []string{dbs[i]}, TTL: 5900*time.Millisecond + time.Duration(k)*40*time.Millisecond})
		if err != nil || len(got) != 1 {
			t.Fatalf("the dead member's lease of %s: %v, %v", dbs[i], got, err)
		}
		expires[dbs[i]] = got[0].ExpiresAt
		want = append(want, dbs[i])
	}

	watch := &startWatch{}
	log := &fleetLog{}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "new", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: ttl,
		MaxStoreCalls: 4, MaxStarting: 1, Publisher: log.publisher(t, "new"),
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
			if err != nil {
				return outbox.ShardStore{}, err
			}
			watch.open(db)
			return outbox.ShardStore{Store: &startWatchStore{Store: s, w: watch, db: db}}, nil
		},
		Processor: outbox.Config{AllTopics: true, PollInterval: 100 * time.Millisecond, RecoveryInterval: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runFleet(t, ctx, f)
	log.await(t, 2*n, time.Minute)
	st := f.Status()
	stop()
	log.check(t, func() map[string]int {
		m := map[string]int{}
		for _, db := range dbs {
			m[db] = 2
		}
		return m
	}())

	var late []string
	var latest time.Duration
	for _, s := range st.Shards {
		d := s.AcquiredAt.Sub(expires[s.Database])
		latest = max(latest, d)
		if d > 1500*time.Millisecond {
			late = append(late, fmt.Sprintf("%s %s", strings.TrimPrefix(s.Database, pg.Name), d.Round(time.Millisecond)))
		}
	}
	t.Logf("databases taken at most %s after their leases expired", latest.Round(time.Millisecond))
	if len(late) > 0 {
		t.Errorf("databases taken more than 1.5s after their leases expired (renewal rounds every 4s): %v", late)
	}
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if !slices.Equal(watch.opened, want) {
		t.Errorf("databases opened in the order %v, want the order their leases expired in, %v", watch.opened, want)
	}
	if watch.maxStarting > 1 {
		t.Errorf("%d databases started at once, MaxStarting is 1", watch.maxStarting)
	}
	if len(watch.early) > 0 {
		t.Errorf("asked for before the database's first claim returned: %v", watch.early)
	}
}

// slotStore is the database's store in TestFleetClaimAfterSlotWait. It has
// no wake-ups (its processor claims every PollInterval); its
// MessagePendingTopics, which Fleet.Backlogs calls in a slot of the
// fleet's store-call budget, waits until hold is closed; it tells when
// its first claim returned and counts the leases recovered.
type slotStore struct {
	outbox.Store
	pg *postgres.Store

	firstClaim chan struct{}
	once       sync.Once
	held       chan struct{} // receives when MessagePendingTopics holds its slot
	hold       chan struct{} // closed to let it return
	recovered  atomic.Int64
}

func (s *slotStore) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	ms, err := s.Store.MessageClaim(ctx, p)
	s.once.Do(func() { close(s.firstClaim) })
	return ms, err
}

func (s *slotStore) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	res, err := s.Store.MessageRecover(ctx, p)
	s.recovered.Add(int64(res.Recovered + res.DeadLettered))
	return res, err
}

func (s *slotStore) MessageExtendLease(ctx context.Context, p outbox.MessageExtendLeaseParams) (outbox.ExtendLeaseResult, error) {
	return s.pg.MessageExtendLease(ctx, p)
}

func (s *slotStore) MessagePendingTopics(ctx context.Context, p outbox.MessagePendingTopicsParams) ([]outbox.PendingTopic, error) {
	s.held <- struct{}{}
	<-s.hold
	return s.pg.MessagePendingTopics(ctx, p)
}

// checkOnce waits for the n messages of db, stops the fleet, and checks
// that each was published, claimed once, and never recovered.
func (s *slotStore) checkOnce(t *testing.T, f *outbox.Fleet, stop func(), log *fleetLog, db string, n int) {
	t.Helper()
	log.await(t, n, 20*time.Second)
	status := f.Status()
	stop()
	log.check(t, map[string]int{db: n})
	if len(status.Shards) != 1 {
		t.Fatalf("serving %d databases, want 1", len(status.Shards))
	}
	if got := status.Shards[0].Progress.Claimed; got != int64(n) {
		t.Errorf("%d messages claimed, want %d: each once", got, n)
	}
	if got := s.recovered.Load(); got != 0 {
		t.Errorf("%d leases recovered, want none", got)
	}
}

// TestFleetClaimAfterSlotWait: a claim that waits for a slot of the
// fleet's store-call budget (MaxStoreCalls) for longer than
// ProcessingTimeout publishes what it claims: its leases begin when it
// holds the slot, not when it began to wait. They began before, and under
// overload the processor counted the messages such a claim returned as
// expired leases before publishing any of them, leaving them to recovery
// (each claimed twice).
func TestFleetClaimAfterSlotWait(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 4, time.Minute)
	dbs, outboxes := fleetDatabases(ctx, t, pg, 1)
	st := &slotStore{firstClaim: make(chan struct{}), held: make(chan struct{}), hold: make(chan struct{})}
	const (
		poll = 2 * time.Second
		pt   = time.Second
		n    = 5
	)
	log := &fleetLog{}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: 2 * time.Second,
		MaxStoreCalls: 1, Publisher: log.publisher(t, "solo"),
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
			st.Store, st.pg = s, s
			return outbox.ShardStore{Store: st}, err
		},
		Processor: outbox.Config{AllTopics: true, PollInterval: poll, ProcessingTimeout: pt, RecoveryInterval: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runFleet(t, ctx, f)
	select {
	case <-st.firstClaim:
	case <-ctx.Done():
		t.Fatal("the database's processor never claimed")
	}
	// The only slot is held from here on, and the messages are due before
	// the processor's next claim, a poll interval after its first.
	backlogs := make(chan []outbox.ShardBacklog, 1)
	go func() { backlogs <- f.Backlogs(ctx) }()
	<-st.held
	for i := range n {
		if _, err := outboxes[dbs[0]].Enqueue(ctx, msg("t", "g", i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(poll + 2*pt)
	close(st.hold)
	if b := <-backlogs; len(b) != 1 || b[0].Err != nil {
		t.Fatalf("backlogs: %+v", b)
	}
	st.checkOnce(t, f, stop, log, dbs[0], n)
}

// offsetClock is the system clock moved forward by off: a processor's
// clock that a test moves on while the processor waits.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// TestFleetExtendAfterSlotWait: a lease extension that waited for a slot
// of the fleet's store-call budget while the processor's clock moved on by
// twice ProcessingTimeout keeps the message it extends: the leases start
// again when it holds the slot, not when it began to wait. They started
// again before, already older than ProcessingTimeout by then, so recovery
// took the message while it was being published (claimed twice). The clock
// moves instead of the test waiting that long: the extension gives up
// waiting for a slot after ProcessingTimeout/2 (1s at least).
func TestFleetExtendAfterSlotWait(t *testing.T) {
	pg, ctx, leaser := fleetSetup(t, 4, time.Minute)
	dbs, outboxes := fleetDatabases(ctx, t, pg, 1)
	st := &slotStore{firstClaim: make(chan struct{}), held: make(chan struct{}), hold: make(chan struct{})}
	const (
		pt = time.Second
		n  = 3
	)
	for i := range n {
		if _, err := outboxes[dbs[0]].Enqueue(ctx, msg("t", "g", i)); err != nil {
			t.Fatal(err)
		}
	}
	log := &fleetLog{}
	inner := log.publisher(t, "solo")
	publishing, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	pub := outbox.PublisherFunc(func(ctx context.Context, ms []outbox.Message) []outbox.Result {
		first.Do(func() { close(publishing); <-release })
		return inner.Publish(ctx, ms)
	})
	clock := &offsetClock{}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "solo", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: 2 * time.Second,
		MaxStoreCalls: 1, Publisher: pub,
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
			st.Store, st.pg = s, s
			return outbox.ShardStore{Store: st}, err
		},
		Processor: outbox.Config{AllTopics: true, ProcessingTimeout: pt, RecoveryInterval: 100 * time.Millisecond, Clock: clock},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runFleet(t, ctx, f)
	select {
	case <-publishing:
	case <-ctx.Done():
		t.Fatal("the database's processor never published")
	}
	// The only slot is held while the messages are being published: the
	// heartbeat's extension (every ProcessingTimeout/4) begins to wait for
	// it, then the clock moves on, then the slot is free.
	backlogs := make(chan []outbox.ShardBacklog, 1)
	go func() { backlogs <- f.Backlogs(ctx) }()
	<-st.held
	time.Sleep(pt / 2)
	clock.off.Store(int64(2 * pt))
	time.Sleep(pt / 10)
	close(st.hold)
	if b := <-backlogs; len(b) != 1 || b[0].Err != nil {
		t.Fatalf("backlogs: %+v", b)
	}
	time.Sleep(pt / 2) // recovery runs every 100 ms
	close(release)
	st.checkOnce(t, f, stop, log, dbs[0], n)
}
