package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Fleet runs one processor per database over many databases (one outbox per
// tenant database, or per shard), spread over the instances of a service:
// each instance runs a Fleet with the same FleetConfig.Databases, and the
// instances lease the databases among themselves through a ShardLeaser.
//
//   - Balanced: with N databases and k live instances each instance serves
//     about N/k; a new instance takes its share within about LeaseTTL (the
//     others stop and release their excess once it lasted LeaseTTL), and
//     the databases of an
//     instance that died move to the others once its lease (LeaseTTL)
//     expires.
//   - One instance at a time: an instance starts a database's processor
//     only after it took the database's lease, stops it (drained) before it
//     releases the lease, and stops it on its own when it could not renew
//     the lease for half of LeaseTTL (5/8 at the latest, whatever its
//     renewal rounds do; from then the processor publishes nothing), so it
//     has stopped before the lease can expire.
//     Within a database the store's leases and FIFO claims still hold.
//   - A dead instance's claims given back at once: an instance that takes
//     a database whose previous lease ended recovers the message leases
//     left in it before its processor starts, when the store is an
//     OrphanRecoverer, instead of waiting for their ProcessingTimeout. The
//     databases must then be served only by the fleet.
//   - A shared connection budget: every store call the processors make goes
//     through MaxStoreCalls slots shared by all the instance's databases,
//     lease recoveries through at most a quarter of them.
//   - Starts in turn: a database taken starts (its store opened, its
//     processor's first claim, which is its start-up probe unless the
//     store has a Ping) while fewer than MaxStarting others
//     are starting, those whose previous lease expired first before the
//     others; its processor's lease recovery and wake-ups (a LISTEN
//     connection on PostgreSQL) begin once its first claim returned and no
//     other database is waiting to start or starting (or, at the latest,
//     LeaseTTL later for recovery, 4 x LeaseTTL for wake-ups). The many
//     databases of an instance that died thus start a batch at a time on
//     the instance that takes them (at the moment their leases expire, not
//     at its next renewal), each publishing again as soon as its own start
//     is done, instead of all at once, each waiting behind all the others.
//   - Wake-ups per database: each processor uses its store's Waker (LISTEN
//     on PostgreSQL) as a single Processor would, and while they are live
//     claims an idle database only every IdlePollInterval (see
//     FleetConfig.Processor).
//   - Health and progress per database: Status.
//
// The program opens a database's store when the Fleet takes it
// (FleetConfig.Open) and may list the databases again while it runs
// (FleetConfig.Databases is re-read every RefreshInterval): added databases
// are taken, removed ones stopped and released.
type Fleet struct {
	cfg    FleetConfig
	log    *slog.Logger
	budget chan struct{}
	// recoveries is the part of budget lease recoveries may take.
	recoveries chan struct{}
	running    atomic.Bool
	tick       time.Duration

	mu       sync.Mutex
	dbs      []string
	listed   time.Time
	listErr  error
	members  []string
	leaseErr error
	ticks    int
	shards   map[string]*fleetShard
	// excessSince is when this instance started serving more than its
	// share (zero when it does not).
	excessSince time.Time
	// queue holds the shards waiting for their turn to start, in order;
	// starting counts those starting (see FleetConfig.MaxStarting). calm
	// is closed while neither is any.
	queue    []*fleetShard
	starting int
	calm     chan struct{}

	// relPending are the releases waiting for the next ShardRelease call;
	// releasing reports that a releaseLoop runs. Both are guarded by
	// relMu.
	relMu      sync.Mutex
	relPending []pendingRelease
	releasing  bool
}

// FleetConfig configures a Fleet. Databases, Open, Publisher and Leaser are
// required; every other field has a default.
type FleetConfig struct {
	// ID names this instance among the fleet's members; its processors are
	// named "<ID>/<database>". Defaults to "<hostname>-<random>". Two live
	// instances must not share an ID.
	ID string
	// Databases lists the databases (shards) the fleet serves, by names the
	// program's Open understands. It is called when Run starts and every
	// RefreshInterval, with a context that ends after LeaseTTL/4; when it
	// fails the last list is kept. Every instance must list the same
	// databases. StaticDatabases wraps a fixed list.
	Databases func(ctx context.Context) ([]string, error)
	// RefreshInterval is how often Databases is called again. Defaults to
	// 30s.
	RefreshInterval time.Duration
	// Open opens the store of one database when this instance took its
	// lease; ShardStore.Close is called when the instance stops serving it.
	// It is called again (with backoff) when it fails or the processor
	// cannot start (store unreachable, not migrated).
	Open func(ctx context.Context, database string) (ShardStore, error)
	// Publisher publishes the messages of every database.
	// ShardFromContext(ctx) in Publish names the database of the batch.
	Publisher Publisher
	// Processor is the configuration of every database's processor; its ID
	// is replaced by "<ID>/<database>", and its Logger gets a "database"
	// attribute. Its Leader must be nil (the leases decide who serves).
	// Its IdlePollInterval defaults to its RecoveryInterval (1m): an idle
	// database whose wake-ups are live (LISTEN on PostgreSQL) costs one
	// claim a minute and its recovery, instead of a claim every
	// PollInterval; see Config.IdlePollInterval for what waits that long.
	// Its DrainTimeout defaults to LeaseTTL/4 and must not exceed it: a
	// processor that stops because its lease is at risk must have drained
	// before the lease can expire.
	Processor Config
	// Leaser is the coordination store (e.g. store/postgres's ShardLeaser).
	Leaser ShardLeaser
	// LeaseTTL is how long a database's lease, and an instance's
	// membership, last without renewal: an instance that dies holds its
	// databases for up to this long. Leases are renewed every LeaseTTL/5.
	// Defaults to 15s.
	LeaseTTL time.Duration
	// MaxStoreCalls bounds the store calls this instance's processors make
	// at once, over all its databases: the connections it uses at once for
	// claims, outcomes, lease extensions and recovery (wake-up listeners
	// hold a connection each on their own). Lease recoveries take at most
	// a quarter of it (at least one call). Defaults to 16.
	MaxStoreCalls int
	// MaxStarting bounds the databases this instance starts at once, from
	// opening a database's store to the end of its processor's first
	// claim. The others wait their turn, holding their leases, those whose
	// previous lease expired first (they went unserved longest) before the
	// others. A database's lease recovery and wake-ups begin once its first
	// claim returned and no database is waiting to start or starting, or
	// LeaseTTL (recovery) or 4 x LeaseTTL (wake-ups; its processor polls
	// until then) after its first claim at the latest. When many databases start at once (an
	// instance died and this one takes its share), each start then costs
	// its own few store calls instead of waiting behind every other
	// database's, and the starts do not compete with the recoveries and
	// listeners of those started before them: unbounded,
	// a few dozen databases starting at once on a busy machine made every
	// first claim wait in MaxStoreCalls for longer than ProcessingTimeout,
	// each database's first publication behind every other's start.
	// Defaults to MaxStoreCalls: a database makes one store call
	// at a time while it starts, so the starts never queue behind each
	// other in the budget, and a database already served waits for at most
	// one of their calls.
	MaxStarting int
	// Logger receives the fleet's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// ShardStore is one database's store, opened by FleetConfig.Open.
type ShardStore struct {
	// Store is the database's outbox store.
	Store Store
	// Close releases what Open opened for the store (its connection pool);
	// nil when there is nothing to release.
	Close func()
}

// StaticDatabases returns a FleetConfig.Databases that lists names.
func StaticDatabases(names ...string) func(context.Context) ([]string, error) {
	names = slices.Clone(names)
	return func(context.Context) ([]string, error) { return names, nil }
}

// ShardStatus is the state of one database this instance serves.
type ShardStatus struct {
	// Database is the database's name, as Databases listed it.
	Database string
	// Epoch is the lease's epoch (see ShardLease).
	Epoch int64
	// AcquiredAt and RenewedAt are when this instance took the lease and
	// last renewed it.
	AcquiredAt, RenewedAt time.Time
	// LeaseExpiresAt is RenewedAt + LeaseTTL: the lease lasts at least
	// until then, by this instance's clock (the coordination store counts
	// from a little later, when the renewal reached it).
	LeaseExpiresAt time.Time
	// Stopping reports that the processor is stopping (the lease is being
	// handed over, lost, or the fleet stops).
	Stopping bool
	// Err is the last error opening the store or starting its processor;
	// nil while the processor runs.
	Err error
	// Health and Progress are the database's processor's.
	Health   Health
	Progress Progress
	// StoreCalls counts the processor's store calls (claims, outcomes,
	// lease extensions, recovery): divided by the time served, the
	// database's cost to the fleet.
	StoreCalls int64
}

// FleetStatus is an instance's view of the fleet.
type FleetStatus struct {
	// ID is this instance's ID.
	ID string
	// Members are the live instances, this one included, at the last
	// renewal.
	Members []string
	// Databases is how many databases the last listing returned; Target is
	// this instance's share of them.
	Databases, Target int
	// Listed are the databases of the last listing, sorted.
	Listed []string
	// LeaseTTL is FleetConfig.LeaseTTL (or its default).
	LeaseTTL time.Duration
	// ListErr is the last error of FleetConfig.Databases, nil once a later
	// call succeeded; LeaseErr the same for the Leaser.
	ListErr, LeaseErr error
	// Shards are the databases this instance serves, by name.
	Shards []ShardStatus
}

type fleetShard struct {
	name       string
	lease      ShardLease
	acquiredAt time.Time
	renewedAt  time.Time
	cancel     context.CancelFunc
	done       chan struct{}
	stopping   bool
	// turn is closed when the shard may start (FleetConfig.MaxStarting);
	// start tells where the shard is in its turn, turnGen which turn it
	// is. All three are guarded by Fleet.mu.
	turn    chan struct{}
	start   startState
	turnGen int
	proc    *Processor
	store   Store // the database's store while its processor runs
	err     error
	calls   atomic.Int64
	// watch stops the processor when the lease goes unrenewed (see
	// Fleet.watchLease); guarded by Fleet.mu.
	watch *time.Timer
}

// startState is where a shard is in its turn to start.
type startState int

const (
	startIdle     startState = iota // neither waiting nor starting
	startQueued                     // in Fleet.queue
	startStarting                   // counted in Fleet.starting
)

// NewFleet returns a Fleet for cfg (defaults applied, then validated; an
// invalid FleetConfig returns a *ValidationError).
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	switch {
	case cfg.Databases == nil:
		return nil, invalid("FleetConfig.Databases", "is nil")
	case cfg.Open == nil:
		return nil, invalid("FleetConfig.Open", "is nil")
	case cfg.Publisher == nil:
		return nil, invalid("FleetConfig.Publisher", "is nil")
	case cfg.Leaser == nil:
		return nil, invalid("FleetConfig.Leaser", "is nil")
	}
	if cfg.ID == "" {
		cfg.ID = defaultID()
	}
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, 30*time.Second)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 15*time.Second)
	cfg.MaxStoreCalls = cmp.Or(cfg.MaxStoreCalls, 16)
	cfg.MaxStarting = cmp.Or(cfg.MaxStarting, cfg.MaxStoreCalls)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Processor.DrainTimeout = cmp.Or(cfg.Processor.DrainTimeout, cfg.LeaseTTL/4)
	if cfg.Processor.IdlePollInterval == 0 {
		d := cfg.Processor.WithDefaults()
		cfg.Processor.IdlePollInterval = max(d.RecoveryInterval, d.PollInterval)
	}
	switch {
	case cfg.RefreshInterval < 0:
		return nil, invalid("FleetConfig.RefreshInterval", "must be positive")
	case cfg.LeaseTTL < 100*time.Millisecond:
		return nil, invalid("FleetConfig.LeaseTTL", fmt.Sprintf("must be at least 100ms, got %s", cfg.LeaseTTL))
	case cfg.MaxStoreCalls < 0:
		return nil, invalid("FleetConfig.MaxStoreCalls", "must be positive")
	case cfg.MaxStarting < 0:
		return nil, invalid("FleetConfig.MaxStarting", "must be positive")
	case cfg.Processor.Leader != nil:
		return nil, invalid("FleetConfig.Processor.Leader", "is set: the fleet's leases already give each database one instance at a time")
	case cfg.Processor.DrainTimeout > cfg.LeaseTTL/4:
		return nil, invalid("FleetConfig.Processor.DrainTimeout", fmt.Sprintf("(%s) must be at most LeaseTTL/4 (%s): "+
			"a processor stopping because its lease is at risk must drain before the lease can expire", cfg.Processor.DrainTimeout, cfg.LeaseTTL/4))
	}
	probe := cfg.Processor
	probe.ID = cfg.ID + "/"
	if err := probe.WithDefaults().Validate(); err != nil {
		return nil, err
	}
	calm := make(chan struct{})
	close(calm)
	return &Fleet{
		cfg:        cfg,
		log:        cfg.Logger.With("fleet", cfg.ID),
		budget:     make(chan struct{}, cfg.MaxStoreCalls),
		recoveries: make(chan struct{}, max(cfg.MaxStoreCalls/4, 1)),
		tick:       cfg.LeaseTTL / 5,
		shards:     map[string]*fleetShard{},
		calm:       calm,
	}, nil
}

// ID returns the instance's ID (FleetConfig.ID or its default).
func (f *Fleet) ID() string { return f.cfg.ID }

// Run joins the fleet and serves this instance's share of the databases
// until ctx ends. It then stops every processor (each drains as
// Processor.Run does), releases their leases and leaves the fleet, so the
// other instances take its databases at their next renewal, and returns
// nil. Leaser and Databases errors do not stop Run: it keeps the last
// database list, stops the processors whose leases it cannot renew, and
// reports the errors in Status. It returns an error only when the fleet
// is already running.
func (f *Fleet) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("outbox: fleet is already running")
	}
	defer f.running.Store(false)
	f.log.Info("outbox fleet started", "lease_ttl", f.cfg.LeaseTTL, "max_store_calls", f.cfg.MaxStoreCalls)
	t := time.NewTicker(f.tick)
	defer t.Stop()
	for {
		// A lease this instance waits for that expires before the next
		// tick (its holder died) is taken when it expires, not up to a
		// tick later.
		var early *time.Timer
		wake := make(<-chan time.Time)
		if at := f.renew(ctx); !at.IsZero() && time.Until(at) < f.tick {
			// Not sooner than a tenth of a tick: a clock ahead of the
			// coordination store's must not make rounds back to back.
			early = time.NewTimer(max(time.Until(at)+expiryMargin, f.tick/10))
			wake = early.C
		}
		select {
		case <-ctx.Done():
			f.shutdown()
			f.log.Info("outbox fleet stopped")
			return nil
		case <-t.C:
		case <-wake:
		}
		if early != nil {
			early.Stop()
		}
	}
}

// expiryMargin is how long after a lease's expiry (by the coordination
// store's clock) an instance that waits for it tries to take it.
const expiryMargin = 20 * time.Millisecond

// shutdown stops every shard, releasing its lease, and leaves the fleet.
func (f *Fleet) shutdown() {
	f.mu.Lock()
	var done []chan struct{}
	for _, sh := range f.shards {
		f.stopLocked(sh, "the fleet stops")
		done = append(done, sh.done)
	}
	f.mu.Unlock()
	for _, d := range done {
		<-d
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.callTimeout())
	defer cancel()
	if _, err := f.cfg.Leaser.ShardMembers(ctx, ShardMembersParams{Member: f.cfg.ID, TTL: f.cfg.LeaseTTL, Leave: true}); err != nil {
		f.log.Warn("leaving the fleet failed; the others take over when the membership expires", "err", err)
	}
}

// renew is one round: heartbeat, renew the leases held, stop what is at
// risk, list the databases when due, and rebalance. Each step has its own
// deadline (callTimeout), so a slow listing never delays a renewal. It
// returns when the first lease this instance would take expires (see
// acquire), or zero.
func (f *Fleet) renew(ctx context.Context) (nextExpiry time.Time) {
	start := time.Now()
	f.mu.Lock()
	f.ticks++
	first := f.ticks == 1
	f.mu.Unlock()
	// The leases first, each call with its own deadline: a slow or failed
	// heartbeat must not keep the leases from being renewed (every
	// processor stops when they are not for half of LeaseTTL).
	var renewed []ShardLease
	var renewErr error
	if held := f.heldNames(); len(held) > 0 {
		rctx, cancel := context.WithTimeout(ctx, f.callTimeout())
		renewed, renewErr = f.cfg.Leaser.ShardRenew(rctx, ShardRenewParams{Member: f.cfg.ID, Shards: held, TTL: f.cfg.LeaseTTL})
		cancel()
	}
	if ctx.Err() != nil {
		return time.Time{}
	}
	f.mu.Lock()
	if renewErr == nil {
		got := map[string]bool{}
		for _, l := range renewed {
			got[l.Shard] = true
		}
		for _, sh := range f.shards {
			if got[sh.name] {
				sh.renewedAt = start
			} else if !sh.stopping {
				f.stopLocked(sh, "its lease was lost")
			}
		}
	}
	for _, sh := range f.shards {
		if !sh.stopping && time.Since(sh.renewedAt) > f.cfg.LeaseTTL/2 {
			f.stopLocked(sh, "its lease could not be renewed for half of LeaseTTL")
		}
	}
	f.mu.Unlock()
	mctx, cancel := context.WithTimeout(ctx, f.callTimeout())
	members, err := f.cfg.Leaser.ShardMembers(mctx, ShardMembersParams{Member: f.cfg.ID, TTL: f.cfg.LeaseTTL})
	cancel()
	if ctx.Err() != nil {
		return time.Time{}
	}
	f.mu.Lock()
	f.leaseErr = cmp.Or(renewErr, err)
	if f.leaseErr != nil {
		f.log.Warn("the shard leaser failed", "err", f.leaseErr)
	}
	if err == nil {
		f.members = members
	}
	listDue := f.listed.IsZero() || start.Sub(f.listed) >= f.cfg.RefreshInterval
	f.mu.Unlock()
	if listDue {
		f.list(ctx, start)
	}
	if err != nil || renewErr != nil || first {
		// The first round only joins: instances started together see each
		// other before they take their shares.
		return time.Time{}
	}
	f.mu.Lock()
	need := f.rebalanceLocked()
	f.mu.Unlock()
	if need > 0 {
		actx, cancel := context.WithTimeout(ctx, f.callTimeout())
		defer cancel()
		return f.acquire(actx, need)
	}
	return time.Time{}
}

// list calls FleetConfig.Databases and keeps its answer, or the last one
// when it fails.
func (f *Fleet) list(ctx context.Context, now time.Time) {
	lctx, cancel := context.WithTimeout(ctx, f.callTimeout())
	defer cancel()
	dbs, err := f.cfg.Databases(lctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listErr = err
	if err != nil {
		if ctx.Err() == nil {
			f.log.Warn("listing the databases failed; keeping the last list", "err", err)
		}
		return
	}
	dbs = slices.Clone(dbs)
	slices.Sort(dbs)
	f.dbs, f.listed = slices.Compact(dbs), now
}

// callTimeout bounds a renewal round's calls to the Leaser (and a
// release): a round that takes longer is cut short, and its leases count as
// not renewed.
func (f *Fleet) callTimeout() time.Duration { return f.cfg.LeaseTTL / 4 }

func (f *Fleet) heldNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.shards))
	for name := range f.shards {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// targetLocked is this instance's share: the databases divided evenly over
// the members, the remainder to the first members in order.
func (f *Fleet) targetLocked() int {
	k := len(f.members)
	idx := slices.Index(f.members, f.cfg.ID)
	if idx < 0 {
		k++
		idx = k - 1
	}
	n := len(f.dbs)
	t := n / k
	if idx < n%k {
		t++
	}
	return t
}

// preference orders databases for one member (rendezvous hashing): each
// instance takes the databases it prefers most and gives up those it
// prefers least, so shares stay put as members come and go.
func preference(member, db string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(db))
	return h.Sum64()
}

// rebalanceLocked stops the databases no longer listed and the excess over
// this instance's share, and returns how many more it should take.
func (f *Fleet) rebalanceLocked() (need int) {
	listed := map[string]bool{}
	for _, db := range f.dbs {
		listed[db] = true
	}
	var active []*fleetShard
	for _, sh := range f.shards {
		switch {
		case sh.stopping:
		case !listed[sh.name]:
			f.stopLocked(sh, "it is no longer listed")
		default:
			active = append(active, sh)
		}
	}
	target := f.targetLocked()
	if len(active) <= target {
		f.excessSince = time.Time{}
		return target - len(active)
	}
	// An excess is handed over once it lasted a lease period. A member
	// that died counts until its membership expires: when its replacement
	// joins meanwhile (a process restarted after a crash), the share looks
	// smaller than it is, and handing over at once would move databases
	// only for the survivors to take the dead member's right after, each
	// move a stop, a release and a start.
	now := time.Now()
	if f.excessSince.IsZero() {
		f.excessSince = now
	}
	if now.Sub(f.excessSince) >= f.cfg.LeaseTTL {
		slices.SortFunc(active, func(a, b *fleetShard) int {
			return cmp.Compare(preference(f.cfg.ID, a.name), preference(f.cfg.ID, b.name))
		})
		for _, sh := range active[:len(active)-target] {
			f.stopLocked(sh, "handing it over to balance the fleet")
		}
		f.excessSince = time.Time{}
	}
	return 0
}

// acquire takes up to need databases whose leases are free, those this
// instance prefers first, and starts serving them. When it took fewer than
// need, it returns when the first live lease of another member expires
// (zero when none tells): a member that died, whose leases this instance
// may take then.
func (f *Fleet) acquire(ctx context.Context, need int) (nextExpiry time.Time) {
	leases, err := f.cfg.Leaser.ShardList(ctx, ShardListParams{})
	if err != nil {
		f.setLeaseErr(err)
		return time.Time{}
	}
	busy := map[string]bool{}
	expiredAt := map[string]time.Time{}
	for _, l := range leases {
		if !l.Expired {
			busy[l.Shard] = true
			if l.Owner != f.cfg.ID && !l.ExpiresAt.IsZero() && (nextExpiry.IsZero() || l.ExpiresAt.Before(nextExpiry)) {
				nextExpiry = l.ExpiresAt
			}
		} else if !l.ExpiresAt.IsZero() {
			expiredAt[l.Shard] = l.ExpiresAt
		}
	}
	f.mu.Lock()
	var free []string
	for _, db := range f.dbs {
		if _, mine := f.shards[db]; !mine && !busy[db] {
			free = append(free, db)
		}
	}
	f.mu.Unlock()
	slices.SortFunc(free, func(a, b string) int {
		return cmp.Compare(preference(f.cfg.ID, b), preference(f.cfg.ID, a))
	})
	if len(free) >= need {
		nextExpiry = time.Time{}
	}
	free = free[:min(len(free), need)]
	if len(free) == 0 {
		return nextExpiry
	}
	// The leases count from before they were asked for: they started
	// during the call, by the coordination store's clock.
	asked := time.Now()
	got, err := f.cfg.Leaser.ShardAcquire(ctx, ShardAcquireParams{Member: f.cfg.ID, Shards: free, TTL: f.cfg.LeaseTTL})
	if err != nil {
		f.setLeaseErr(err)
		return time.Time{}
	}
	// The databases unserved longest start first (FleetConfig.MaxStarting);
	// a released lease counts as expired now.
	now := time.Now()
	since := func(shard string) time.Time { return cmp.Or(expiredAt[shard], now) }
	slices.SortStableFunc(got, func(a, b ShardLease) int { return since(a.Shard).Compare(since(b.Shard)) })
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range got {
		f.startLocked(l, asked, expiredAt[l.Shard])
	}
	return nextExpiry
}

func (f *Fleet) setLeaseErr(err error) {
	f.mu.Lock()
	f.leaseErr = err
	f.mu.Unlock()
	f.log.Warn("the shard leaser failed", "err", err)
}

// startLocked starts serving the database of lease l, asked for at
// asked. expiredAt is when the previous lease ran out (zero when there was
// none, or it was released): the log tells how long the database went
// unserved.
func (f *Fleet) startLocked(l ShardLease, asked, expiredAt time.Time) {
	// The shard's context does not end with Run's: shutdown stops each
	// shard itself, after which its lease is released.
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), shardCtxKey{}, l))
	sh := &fleetShard{name: l.Shard, lease: l, acquiredAt: asked, renewedAt: asked, cancel: cancel, done: make(chan struct{})}
	sh.watch = time.AfterFunc(f.leaseLimit()-time.Since(asked), func() { f.watchLease(sh) })
	f.shards[l.Shard] = sh
	// Queued here, in the order the leases were taken, not when serve
	// begins: goroutines begin in no particular order.
	turn := f.queueLocked(sh)
	if expiredAt.IsZero() {
		f.log.Info("serving a database", "database", l.Shard, "epoch", l.Epoch)
	} else {
		f.log.Info("serving a database", "database", l.Shard, "epoch", l.Epoch, "lease_expired_at", expiredAt)
	}
	go f.serve(ctx, sh, turn)
}

// stopLocked stops sh's processor; its lease is released once the
// processor has stopped. Releasing is safe even when the lease was lost:
// ShardRelease ends only a live lease this member holds. A lease at risk
// (not renewed for a while) that is still ours is then free at once
// instead of held, unserved, until it expires.
func (f *Fleet) stopLocked(sh *fleetShard, why string) {
	if sh.stopping {
		return
	}
	sh.stopping = true
	f.log.Info("stopping a database's processor", "database", sh.name, "epoch", sh.lease.Epoch, "reason", why)
	sh.cancel()
}

// serve runs the database's processor until its context ends, reopening
// the store with backoff when opening or starting fails, then releases the
// lease.
func (f *Fleet) serve(ctx context.Context, sh *fleetShard, turn int) {
	defer close(sh.done)
	backoff := 500 * time.Millisecond
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			f.mu.Lock()
			turn = f.queueLocked(sh)
			f.mu.Unlock()
		}
		if !f.awaitTurn(ctx, sh, turn) {
			break
		}
		err := f.serveOnce(ctx, sh, turn)
		f.endTurn(sh, turn)
		if ctx.Err() != nil {
			break
		}
		f.mu.Lock()
		sh.err = err
		f.mu.Unlock()
		f.log.Warn("a database's processor cannot run; retrying", "database", sh.name, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(backoff*2, 30*time.Second)
	}
	if err := f.release(sh.name); err != nil {
		f.log.Warn("releasing a database's lease failed; it expires on its own", "database", sh.name, "err", err)
	}
	f.mu.Lock()
	sh.watch.Stop()
	if f.shards[sh.name] == sh {
		delete(f.shards, sh.name)
	}
	f.mu.Unlock()
}

// release releases the lease of database name once its processor
// stopped. The releases of databases stopped together (a hand-over, a lease
// renewal that failed, shutdown) go in one ShardRelease call, one call at a
// time: a call per database, dozens at once, would queue the renewals
// behind them on the coordination store's connections.
func (f *Fleet) release(name string) error {
	done := make(chan error, 1)
	f.relMu.Lock()
	f.relPending = append(f.relPending, pendingRelease{name, done})
	if !f.releasing {
		f.releasing = true
		go f.releaseLoop()
	}
	f.relMu.Unlock()
	return <-done
}

// releaseLoop releases what is pending, in batches, until nothing is.
func (f *Fleet) releaseLoop() {
	for {
		f.relMu.Lock()
		batch := f.relPending
		f.relPending = nil
		if len(batch) == 0 {
			f.releasing = false
			f.relMu.Unlock()
			return
		}
		f.relMu.Unlock()
		names := make([]string, len(batch))
		for i, r := range batch {
			names[i] = r.name
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.callTimeout())
		err := f.cfg.Leaser.ShardRelease(ctx, ShardReleaseParams{Member: f.cfg.ID, Shards: names})
		cancel()
		for _, r := range batch {
			r.done <- err
		}
	}
}

type pendingRelease struct {
	name string
	done chan<- error
}

func (f *Fleet) serveOnce(ctx context.Context, sh *fleetShard, turn int) error {
	ss, err := f.cfg.Open(ctx, sh.name)
	if err != nil {
		return fmt.Errorf("outbox: fleet: open %q: %w", sh.name, err)
	}
	if ss.Close != nil {
		defer ss.Close()
	}
	if ss.Store == nil {
		return fmt.Errorf("outbox: fleet: open %q returned no store", sh.name)
	}
	cfg := f.cfg.Processor
	cfg.ID = f.cfg.ID + "/" + sh.name
	if cfg.Logger != nil {
		cfg.Logger = cfg.Logger.With("database", sh.name)
	}
	started, recoverable, wakeable := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	fs := &fleetStore{Store: ss.Store, budget: f.budget, recoveries: f.recoveries, calls: &sh.calls,
		recoverable: recoverable, wakeable: wakeable, claimed: func() {
			once.Do(func() { close(started); f.endTurn(sh, turn) })
		}}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go f.settle(sctx, started, recoverable, f.cfg.LeaseTTL)
	go f.settle(sctx, started, wakeable, 4*f.cfg.LeaseTTL)
	f.recoverOrphans(ctx, sh, fs)
	p, err := NewProcessor(fs, f.leasePublisher(sh), cfg)
	if err != nil {
		return err
	}
	// sh.err stays until the processor runs (Status hides it then): a
	// retry's probe is still failing until it passes.
	f.mu.Lock()
	sh.proc, sh.store = p, ss.Store
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		sh.store = nil // closed when serveOnce returns
		f.mu.Unlock()
	}()
	return p.Run(ctx)
}

// queueLocked queues sh to start (see FleetConfig.MaxStarting) and
// returns its turn, for awaitTurn and endTurn.
func (f *Fleet) queueLocked(sh *fleetShard) (turn int) {
	sh.turnGen++
	sh.turn = make(chan struct{})
	sh.start = startQueued
	f.queue = append(f.queue, sh)
	select {
	case <-f.calm:
		f.calm = make(chan struct{})
	default:
	}
	f.admitLocked()
	return sh.turnGen
}

// awaitTurn waits for sh's turn to start; it returns false when ctx ended
// first. A turn lasts at most LeaseTTL: a database whose start hangs (an
// unreachable server) does not hold the others back for longer. (A
// shorter bound let a busy machine's slow starts, a second or more each,
// all start at once again.)
func (f *Fleet) awaitTurn(ctx context.Context, sh *fleetShard, turn int) bool {
	f.mu.Lock()
	ch := sh.turn
	f.mu.Unlock()
	select {
	case <-ch:
		time.AfterFunc(f.cfg.LeaseTTL, func() { f.endTurn(sh, turn) })
		return true
	case <-ctx.Done():
		f.endTurn(sh, turn)
		return false
	}
}

// endTurn ends sh's turn to start: its first claim returned, its
// processor could not start, the turn lasted its longest, or sh stopped
// (while waiting for its turn, too). The next shards in the queue may
// start. Ending a turn that already ended, or a former one, does nothing.
func (f *Fleet) endTurn(sh *fleetShard, turn int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sh.turnGen != turn {
		return
	}
	switch sh.start {
	case startQueued:
		f.queue = slices.DeleteFunc(f.queue, func(q *fleetShard) bool { return q == sh })
	case startStarting:
		f.starting--
	}
	sh.start = startIdle
	f.admitLocked()
}

// admitLocked lets the queued shards start, in order, while fewer than
// MaxStarting are starting, and closes calm when none is left.
func (f *Fleet) admitLocked() {
	for len(f.queue) > 0 && f.starting < f.cfg.MaxStarting {
		sh := f.queue[0]
		f.queue = f.queue[1:]
		sh.start = startStarting
		f.starting++
		close(sh.turn)
	}
	if len(f.queue) == 0 && f.starting == 0 {
		select {
		case <-f.calm:
		default:
			close(f.calm)
		}
	}
}

// settle closes settled once started is closed (the database's first
// claim returned) and no database of this instance is waiting to start or
// starting, or bound after its first claim at the latest: then the
// database's lease recovery (bound LeaseTTL) or wake-ups (4 x LeaseTTL)
// begin. Until then they would compete with the starts for the fleet's
// store calls and the servers (a listener opens a connection and runs a
// few statements); after, they must not wait for an instance that keeps
// taking databases (a chaos run on an overloaded machine, where the
// starts never stopped: most databases went minutes without recovery).
// Wake-ups wait longer: without them the processor still polls every
// PollInterval, and 66 databases starting at once took 10 s on a busy
// machine, longer when the listeners of the first began after LeaseTTL.
func (f *Fleet) settle(ctx context.Context, started <-chan struct{}, settled chan<- struct{}, bound time.Duration) {
	select {
	case <-started:
	case <-ctx.Done():
		return
	}
	f.mu.Lock()
	calm := f.calm
	f.mu.Unlock()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-calm:
	case <-t.C:
	case <-ctx.Done():
		return
	}
	close(settled)
}

// Status returns this instance's view of the fleet and the state of every
// database it serves.
func (f *Fleet) Status() FleetStatus {
	f.mu.Lock()
	st := FleetStatus{
		ID: f.cfg.ID, Members: slices.Clone(f.members), Databases: len(f.dbs), Listed: slices.Clone(f.dbs),
		LeaseTTL: f.cfg.LeaseTTL, ListErr: f.listErr, LeaseErr: f.leaseErr,
	}
	if len(f.members) > 0 {
		st.Target = f.targetLocked()
	}
	type item struct {
		s    ShardStatus
		proc *Processor
	}
	items := make([]item, 0, len(f.shards))
	for _, sh := range f.shards {
		items = append(items, item{ShardStatus{
			Database: sh.name, Epoch: sh.lease.Epoch, AcquiredAt: sh.acquiredAt, RenewedAt: sh.renewedAt,
			LeaseExpiresAt: sh.renewedAt.Add(f.cfg.LeaseTTL), Stopping: sh.stopping, Err: sh.err, StoreCalls: sh.calls.Load(),
		}, sh.proc})
	}
	f.mu.Unlock()
	for _, it := range items {
		if it.proc != nil {
			it.s.Health, it.s.Progress = it.proc.Health(), it.proc.Progress()
			if it.s.Health.Running {
				it.s.Err = nil
			}
		}
		st.Shards = append(st.Shards, it.s)
	}
	slices.SortFunc(st.Shards, func(a, b ShardStatus) int { return cmp.Compare(a.Database, b.Database) })
	return st
}

// Leases returns the lease of every database that has one, live or
// expired, whoever holds it: the fleet as the coordination store sees it
// (Status is this instance's view). It is one ShardLeaser.ShardList call.
func (f *Fleet) Leases(ctx context.Context) ([]ShardLease, error) {
	return f.cfg.Leaser.ShardList(ctx, ShardListParams{})
}

// ShardBacklog is what waits in one database: its PENDING messages that
// are due.
type ShardBacklog struct {
	// Database is the database's name.
	Database string
	// Known reports that the store counted (it implements
	// PendingTopicLister and answered); Pending and OldestDueAt are
	// meaningless otherwise.
	Known bool
	// Pending counts the PENDING messages due now, over every topic and
	// tenant.
	Pending int64
	// OldestDueAt is the earliest due time among them; zero when none is
	// due.
	OldestDueAt time.Time
	// Err is the store's error, when it failed.
	Err error
}

// Backlogs counts the due PENDING messages of each database whose
// processor runs in this instance, one MessagePendingTopics call per
// database (PostgreSQL reads them from the partial index of pending
// messages), made at once within the fleet's store-call budget
// (MaxStoreCalls) but not counted in ShardStatus.StoreCalls. Databases
// whose store cannot count are returned with Known false. The result is
// sorted by database.
func (f *Fleet) Backlogs(ctx context.Context) []ShardBacklog {
	type item struct {
		name  string
		store Store
	}
	f.mu.Lock()
	items := make([]item, 0, len(f.shards))
	for _, sh := range f.shards {
		if sh.store != nil && !sh.stopping {
			items = append(items, item{sh.name, sh.store})
		}
	}
	f.mu.Unlock()
	out := make([]ShardBacklog, len(items))
	var wg sync.WaitGroup
	now := time.Now()
	for i, it := range items {
		out[i].Database = it.name
		l, ok := it.store.(PendingTopicLister)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case f.budget <- struct{}{}:
			case <-ctx.Done():
				out[i].Err = ctx.Err()
				return
			}
			topics, err := l.MessagePendingTopics(ctx, MessagePendingTopicsParams{DueBefore: now})
			<-f.budget
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].Known = true
			for _, t := range topics {
				out[i].Pending += t.Messages
				if !t.OldestDueAt.IsZero() && (out[i].OldestDueAt.IsZero() || t.OldestDueAt.Before(out[i].OldestDueAt)) {
					out[i].OldestDueAt = t.OldestDueAt
				}
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b ShardBacklog) int { return cmp.Compare(a.Database, b.Database) })
	return out
}

// fleetStore is a database's store as its processor sees it in a fleet:
// the calls the processor makes take a slot of the fleet's budget, and are
// counted. It offers every optional capability the processor looks for,
// behaving as the processor does without it when the store lacks it.
type fleetStore struct {
	Store
	budget chan struct{}
	// recoveries bounds the lease recoveries in budget (see
	// MessageRecover).
	recoveries chan struct{}
	calls      *atomic.Int64
	// recoverable and wakeable are closed once the processor's first
	// claim returned (claimed is called then) and no other database is
	// starting, or later than that at the latest (see Fleet.settle): lease
	// recovery and wake-ups wait for them.
	recoverable, wakeable chan struct{}
	claimed               func()
}

func (s *fleetStore) enter(ctx context.Context) error {
	s.calls.Add(1)
	select {
	case s.budget <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *fleetStore) leave() { <-s.budget }

// MessageClaim takes a budget slot for the store's MessageClaim. The first
// one to return ends the database's start.
func (s *fleetStore) MessageClaim(ctx context.Context, p MessageClaimParams) ([]Message, error) {
	msgs, _, err := s.claimInSlot(ctx, p, func() time.Time { return p.Now })
	return msgs, err
}

// claimInSlot is MessageClaim with p.Now read from now once the claim
// holds its budget slot (the processor's claims: see slotClaimer); it
// returns that Now.
func (s *fleetStore) claimInSlot(ctx context.Context, p MessageClaimParams, now func() time.Time) ([]Message, time.Time, error) {
	defer s.claimed()
	if err := s.enter(ctx); err != nil {
		return nil, time.Time{}, err
	}
	defer s.leave()
	p.Now = now()
	msgs, err := s.Store.MessageClaim(ctx, p)
	return msgs, p.Now, err
}

// MessageFinish takes a budget slot for the store's MessageFinish.
func (s *fleetStore) MessageFinish(ctx context.Context, p MessageFinishParams) (FinishResult, error) {
	if err := s.enter(ctx); err != nil {
		return FinishResult{}, err
	}
	defer s.leave()
	return s.Store.MessageFinish(ctx, p)
}

// MessageRecover takes a budget slot for the store's MessageRecover, once
// recoverable. Recoveries, which every database runs every RecoveryInterval
// whether it has work or not, take at most a quarter of the budget: when
// the servers are slow to answer, the claims and outcomes that publish
// must not wait behind them.
func (s *fleetStore) MessageRecover(ctx context.Context, p MessageRecoverParams) (RecoverResult, error) {
	select {
	case <-s.recoverable:
	case <-ctx.Done():
		return RecoverResult{}, ctx.Err()
	}
	select {
	case s.recoveries <- struct{}{}:
	case <-ctx.Done():
		return RecoverResult{}, ctx.Err()
	}
	defer func() { <-s.recoveries }()
	if err := s.enter(ctx); err != nil {
		return RecoverResult{}, err
	}
	defer s.leave()
	return s.Store.MessageRecover(ctx, p)
}

// MessageList takes a budget slot for the store's MessageList.
func (s *fleetStore) MessageList(ctx context.Context, p MessageListParams) (MessagePage, error) {
	if err := s.enter(ctx); err != nil {
		return MessagePage{}, err
	}
	defer s.leave()
	return s.Store.MessageList(ctx, p)
}

// probesByClaim reports that the processor's first claim stands for its
// start-up probe (see claimProber) when the store has no Ping: the probe
// would list a message, a query that fails as the claim does when the
// store is unavailable or not migrated, and a database's start is then one
// store call instead of two. A store's Ping is kept: it may check what a
// claim does not (a MongoDB collection that does not exist answers a claim
// with nothing).
func (s *fleetStore) probesByClaim() bool {
	_, ok := s.Store.(Pinger)
	return !ok
}

// Ping is the store's Ping (Pinger), else the processor's own probe: one
// message listed.
func (s *fleetStore) Ping(ctx context.Context) error {
	pg, ok := s.Store.(Pinger)
	if !ok {
		_, err := s.MessageList(ctx, MessageListParams{Limit: 1})
		return err
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	return pg.Ping(ctx)
}

// Wakeups is WakeupsLive's channel.
func (s *fleetStore) Wakeups(ctx context.Context) <-chan struct{} {
	ch, _ := s.WakeupsLive(ctx)
	return ch
}

// WakeupsLive is the store's Wakeups (Waker), started once wakeable (the
// processor polls until then), else a channel that only closes when ctx
// ends, as a processor without wake-ups polls. They are live once started
// while the store says they are (LiveWaker); never when it cannot tell.
func (s *fleetStore) WakeupsLive(ctx context.Context) (<-chan struct{}, func() bool) {
	w, ok := s.Store.(Waker)
	if !ok {
		ch := make(chan struct{})
		context.AfterFunc(ctx, func() { close(ch) })
		return ch, func() bool { return false }
	}
	var live atomic.Pointer[func() bool]
	ch := make(chan struct{}, 1)
	go func() {
		defer close(ch)
		select {
		case <-s.wakeable:
		case <-ctx.Done():
			return
		}
		var in <-chan struct{}
		if lw, ok := w.(LiveWaker); ok {
			var f func() bool
			in, f = lw.WakeupsLive(ctx)
			live.Store(&f)
		} else {
			in = w.Wakeups(ctx)
		}
		for range in {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch, func() bool {
		f := live.Load()
		return f != nil && (*f)()
	}
}

// MessageExtendLease is the store's (LeaseExtender); a store without it
// extends nothing and reports no lease lost, as a processor without it
// never extends.
func (s *fleetStore) MessageExtendLease(ctx context.Context, p MessageExtendLeaseParams) (ExtendLeaseResult, error) {
	res, _, err := s.extendInSlot(ctx, p, func() time.Time { return p.Now })
	return res, err
}

// extendInSlot is MessageExtendLease with p.Now read from now once the
// extension holds its budget slot (the processor's heartbeat: see
// slotExtender); it returns that Now.
func (s *fleetStore) extendInSlot(ctx context.Context, p MessageExtendLeaseParams, now func() time.Time) (ExtendLeaseResult, time.Time, error) {
	ext, ok := s.Store.(LeaseExtender)
	if !ok {
		return ExtendLeaseResult{}, now(), nil
	}
	if err := s.enter(ctx); err != nil {
		return ExtendLeaseResult{}, time.Time{}, err
	}
	defer s.leave()
	p.Now = now()
	res, err := ext.MessageExtendLease(ctx, p)
	return res, p.Now, err
}

// MessagePendingTopics is the store's (PendingTopicLister); a store
// without it lists none.
func (s *fleetStore) MessagePendingTopics(ctx context.Context, p MessagePendingTopicsParams) ([]PendingTopic, error) {
	l, ok := s.Store.(PendingTopicLister)
	if !ok {
		return nil, nil
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	return l.MessagePendingTopics(ctx, p)
}

// DeadLetterBlocking is the store's (DeadLetterBlocker), false without it.
func (s *fleetStore) DeadLetterBlocking() bool {
	b, ok := s.Store.(DeadLetterBlocker)
	return ok && b.DeadLetterBlocking()
}
