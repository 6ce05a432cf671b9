package mongo

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/internal/surface"
	"github.com/outboxkit/outboxkit/internal/wake"
	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultTablePrefix is the prefix of the store's collections when
// Options.TablePrefix is empty: outbox_messages, outbox_attempts,
// outbox_locks, outbox_counters, outbox_inbox, outbox_pauses and
// outbox_migrations.
const DefaultTablePrefix = "outbox_"

// DefaultClaimPerGroup is the default of Options.ClaimPerGroup. It is 10,
// as in store/mysql and store/sqlite (store/postgres's is 100): a claim
// already locks and reads about Limit groups, so a short run costs no round
// trip, spreads a claim over more groups and leaves fewer messages to
// release when a failure blocks a group.
const DefaultClaimPerGroup = 10

// Options configures a Store. The zero value is valid.
type Options struct {
	// TablePrefix names the collections (the store's tables):
	// <prefix>messages, <prefix>attempts, <prefix>locks, <prefix>counters,
	// <prefix>inbox, <prefix>pauses and <prefix>migrations. It may hold
	// letters, digits, '_' and '.' (at most 64). Defaults to
	// DefaultTablePrefix.
	TablePrefix string
	// CollectionPrefix is TablePrefix's former name. When both are set
	// they must be equal.
	//
	// Deprecated: use TablePrefix, the option's name in every store.
	CollectionPrefix string
	// ClaimPerGroup is the most messages of one ordered group a claim takes
	// while other groups have claimable messages too; a claim that finds
	// fewer than its Limit takes more of the groups it cut. Defaults to
	// DefaultClaimPerGroup.
	ClaimPerGroup int
	// LockTTL is how long a claim or enqueue may hold a group's lock
	// document before another process may take it over (a process that
	// died holding it). Claims hold locks for a few round trips only.
	// Defaults to 30 seconds.
	LockTTL time.Duration
	// DisableChangeStreams makes Wakeups use the in-process signal and the
	// processor's polling only, even when the server has change streams.
	DisableChangeStreams bool
	// Clock is the store's time source for the fields a caller leaves
	// zero. Defaults to outbox.SystemClock.
	Clock outbox.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
}

var (
	_ surface.Store[context.Context] = (*Store)(nil)
	_ outbox.Admin                   = (*Store)(nil)
)

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_.]{0,64}$`)

// Store is an outbox.Store, an outbox.Enqueuer[context.Context] and an
// outbox.InboxStore[context.Context] over one MongoDB database: the
// caller's "transaction" is the context that carries its session (see the
// package documentation). It is safe
// for concurrent use.
type Store struct {
	db       *mongo.Database
	msgs     *mongo.Collection
	attempts *mongo.Collection
	locks    *mongo.Collection
	counters *mongo.Collection
	inbox    *mongo.Collection
	pauses   *mongo.Collection
	versions *mongo.Collection
	opts     Options
	clock    outbox.Clock
	log      *slog.Logger
	wake     *wake.Hub

	tenants tenantCache
	leaseMu [16]chan struct{} // see lockOwner

	mu     sync.Mutex
	closed bool
}

// lockOwner takes the lock under which this Store writes the lease
// extensions, the outcomes and the recoveries of owner, one at a time, and
// returns its release (or ctx's error). On MongoDB each of those fenced
// updates is atomic and they need no lock; FerretDB v1.24 runs an update by
// reading the matching documents and writing each back whole, without
// checking the filter again, so an extension that read a message just
// before its outcome was written wrote it back PROCESSING, under a lease
// its processor had let go (issue #12: the message stayed there until the
// lease expired, then was published again), and a recovery that read an
// expired lease wrote it back PENDING over the new lease its owner took
// after releasing it (see MessageRecover). A processor's heartbeat and
// recorder share its owner ID and, in one process, its Store.
func (s *Store) lockOwner(ctx context.Context, owner string) (func(), error) {
	return s.lockOwners(ctx, []string{owner})
}

// lockOwners is lockOwner for several owners at once. It takes their locks
// in ascending order, each once (owners may share one), so that it cannot
// deadlock with another lockOwners or a lockOwner.
func (s *Store) lockOwners(ctx context.Context, owners []string) (func(), error) {
	var slots []int
	for _, o := range owners {
		h := fnv.New32a()
		_, _ = h.Write([]byte(o))
		slots = append(slots, int(h.Sum32()%uint32(len(s.leaseMu))))
	}
	slices.Sort(slots)
	slots = slices.Compact(slots)
	unlock := func(n int) {
		for _, i := range slots[:n] {
			<-s.leaseMu[i]
		}
	}
	for n, i := range slots {
		select {
		case s.leaseMu[i] <- struct{}{}:
		case <-ctx.Done():
			unlock(n)
			return nil, ctx.Err()
		}
	}
	return func() { unlock(len(slots)) }, nil
}

// tenantCache remembers the tenant of each message this Store claimed
// until its outcome is written, so that recording the attempt history
// needs no read when every outcome applied. It forgets everything when it
// holds maxTenants messages (the outcomes of those are then read back).
type tenantCache struct {
	mu sync.Mutex
	m  map[string]string
}

const maxTenants = 1 << 16

func (c *tenantCache) put(msgs []outbox.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m)+len(msgs) > maxTenants {
		c.m = make(map[string]string, len(msgs))
	}
	for i := range msgs {
		c.m[msgs[i].ID] = msgs[i].Tenant
	}
}

func (c *tenantCache) take(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[id]
	if ok {
		delete(c.m, id)
	}
	return t, ok
}

// New returns a Store over db. It does not touch the database; call
// Migrate once (it is idempotent) before use.
func New(db *mongo.Database, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if opts.CollectionPrefix != "" && opts.TablePrefix != "" && opts.CollectionPrefix != opts.TablePrefix {
		return nil, outbox.InvalidParam("Options.CollectionPrefix", fmt.Sprintf("%q differs from Options.TablePrefix %q: set TablePrefix only (CollectionPrefix is its former name)", opts.CollectionPrefix, opts.TablePrefix))
	}
	opts.TablePrefix = cmp.Or(opts.TablePrefix, opts.CollectionPrefix, DefaultTablePrefix)
	opts.CollectionPrefix = opts.TablePrefix
	if !prefixRE.MatchString(opts.TablePrefix) {
		return nil, outbox.InvalidParam("Options.TablePrefix", fmt.Sprintf("%q: use at most 64 letters, digits, '_' or '.'", opts.TablePrefix))
	}
	if opts.ClaimPerGroup < 0 {
		return nil, outbox.InvalidParam("Options.ClaimPerGroup", "must not be negative")
	}
	opts.ClaimPerGroup = cmp.Or(opts.ClaimPerGroup, DefaultClaimPerGroup)
	if opts.LockTTL < 0 {
		return nil, outbox.InvalidParam("Options.LockTTL", "must not be negative")
	}
	if opts.LockTTL == 0 {
		opts.LockTTL = 30 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = outbox.SystemClock
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	p := opts.TablePrefix
	st := &Store{
		db:       db,
		msgs:     db.Collection(p + "messages"),
		attempts: db.Collection(p + "attempts"),
		locks:    db.Collection(p + "locks"),
		counters: db.Collection(p + "counters"),
		inbox:    db.Collection(p + "inbox"),
		pauses:   db.Collection(p + "pauses"),
		versions: db.Collection(p + "migrations"),
		opts:     opts,
		clock:    opts.Clock,
		log:      opts.Logger,
		wake:     wake.New(),
	}
	for i := range st.leaseMu {
		st.leaseMu[i] = make(chan struct{}, 1)
	}
	return st, nil
}

// Database returns the database the Store works in.
func (s *Store) Database() *mongo.Database { return s.db }

// Messages returns the messages collection (for operators' own queries;
// write to it only through the Store).
func (s *Store) Messages() *mongo.Collection { return s.msgs }

// Close closes the Wakeups channels. It does not disconnect the client,
// which the caller owns.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.wake.Close()
	}
	return nil
}

// Notify wakes the Wakeups listeners of this process. MessageEnqueue and
// InTx call it after they commit; call it after committing a transaction
// of your own that enqueued, unless the server has change streams.
func (s *Store) Notify() { s.wake.Notify() }

// InTx runs fn in a MongoDB transaction (Session.WithTransaction): the
// session travels in the context fn receives, so every operation fn runs
// with that context, and every EnqueueTx given it as the transaction,
// commits or aborts together. fn may run more
// than once (the driver retries transient transaction errors), so it must
// be safe to repeat. After the commit the Wakeups listeners of this process
// are woken.
//
// Transactions need a replica set or a sharded cluster; on a standalone
// server InTx returns the server's error.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	sess, err := s.db.Client().StartSession()
	if err != nil {
		return fmt.Errorf("mongo: start session: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		return nil, fn(ctx)
	})
	if err != nil {
		return err
	}
	s.Notify()
	return nil
}

func (s *Store) now(t time.Time) time.Time {
	if t.IsZero() {
		t = s.clock.Now()
	}
	return t.UTC().Truncate(time.Millisecond)
}

func token() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func notFound(tenant, id string) error {
	return fmt.Errorf("%w: message %q in tenant %q", outbox.ErrNotFound, id, tenant)
}

// dupIndexes returns the indexes of the writes that failed with a
// duplicate key error, and whether every write error was one.
func dupIndexes(err error) (map[int]bool, bool) {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return nil, false
	}
	out := map[int]bool{}
	for _, we := range bwe.WriteErrors {
		if we.Code != 11000 && we.Code != 11001 {
			return nil, false
		}
		out[we.Index] = true
	}
	return out, true
}

var _ outbox.Pinger = (*Store)(nil)

// Ping implements outbox.Pinger: it reads the schema version (one small
// read of the versions collection) and reports outbox.ErrNotMigrated when
// Migrate never ran: the claim's FIFO rests on the unique indexes Migrate
// creates. Processor.Run's start-up probe calls it instead of listing one
// message, which a server that sorts in memory (FerretDB) answers by
// reading the whole collection.
func (s *Store) Ping(ctx context.Context) error {
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return fmt.Errorf("mongo: ping: %w", err)
	}
	if v == 0 {
		return fmt.Errorf("mongo: ping: %w: no schema version recorded (call Migrate)", outbox.ErrNotMigrated)
	}
	return nil
}
