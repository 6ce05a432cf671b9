package mongo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// Default collection names, as in seed 004.
const (
	DefaultEventsTable       = "outbox_events"
	DefaultDispatchJobsTable = "outbox_dispatch_jobs"
)

// DefaultNullGroup is the group of documents whose messageGroup is null or
// missing, as in the seed.
const DefaultNullGroup = "default"

// Seed statuses.
const (
	StatusPending    = "PENDING"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Options configures a Store.
type Options struct {
	// EventsTable is the collection of EVENT items. Defaults to
	// "outbox_events".
	EventsTable string
	// DispatchJobsTable is the collection of DISPATCH_JOB items. Defaults
	// to "outbox_dispatch_jobs".
	DispatchJobsTable string
	// Logger defaults to discarding.
	Logger *slog.Logger

	// UnorderedNullGroup sends documents whose messageGroup is null or
	// missing without FIFO, in parallel. By default they form one FIFO
	// group, reported as Group "default", as in the seed (messageGroup ??
	// "default").
	UnorderedNullGroup bool
	// RecoveryCountsAttempt makes recovery of a stuck PROCESSING document
	// count the lost attempt in retryCount, and mark the document FAILED
	// when that was its last one (a document that crashes its processor
	// then stops being retried). By default recovery leaves retryCount
	// alone, as in the seed: "no lost messages, just delayed".
	RecoveryCountsAttempt bool
	// MaxClaimPerGroup is the most documents of one group claimed at once;
	// 0 (the default) means up to the claim's limit. A group is not claimed
	// again while documents of it are in flight, so a small value bounds
	// the group's rate to MaxClaimPerGroup documents per poll.
	MaxClaimPerGroup int
	// LocksCollection is the collection of the claim locks. Defaults to
	// "outbox_processor_locks".
	LocksCollection string
}

// Store is an outbox.Store over seed 004's collections in MongoDB. It is
// safe for concurrent use.
type Store struct {
	db     *mongo.Database
	locks  *mongo.Collection
	core   *seedcore.Core
	tables []*table      // events, dispatch jobs
	budget time.Duration // claimBudget; tests change it
	// claimed is set once a claim leased something: the first claim
	// hands out its first documents at once (claimPace).
	claimed atomic.Bool

	mu sync.Mutex // guards the tables' lastGroup and groupsFit
}

// table is one of the two collections.
type table struct {
	topic     string
	raw       string // the collection's name
	coll      *mongo.Collection
	lastGroup *string // the group claimed last (round robin); guarded by Store.mu
	groupsFit bool    // the last claim saw every unfinished document; guarded by Store.mu
}

// New returns a Store over db, a MongoDB database holding seed 004's
// collections (see the package doc). It does not touch the database; see
// CreateTables.
func New(db *mongo.Database, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if opts.LocksCollection == "" {
		opts.LocksCollection = DefaultLocksCollection
	}
	for _, c := range []struct{ field, name string }{
		{"Options.EventsTable", opts.EventsTable}, {"Options.DispatchJobsTable", opts.DispatchJobsTable},
		{"Options.LocksCollection", opts.LocksCollection},
	} {
		if err := checkCollectionName(c.name); err != nil {
			return nil, outbox.InvalidParam(c.field, err.Error())
		}
	}
	if strings.EqualFold(opts.LocksCollection, cmpOr(opts.EventsTable, DefaultEventsTable)) ||
		strings.EqualFold(opts.LocksCollection, cmpOr(opts.DispatchJobsTable, DefaultDispatchJobsTable)) {
		return nil, outbox.InvalidParam("Options.LocksCollection", "must differ from the item collections")
	}
	o := seedcore.Options{
		EventsTable: opts.EventsTable, DispatchJobsTable: opts.DispatchJobsTable, Logger: opts.Logger,
		UnorderedNullGroup: opts.UnorderedNullGroup, RecoveryCountsAttempt: opts.RecoveryCountsAttempt,
		MaxClaimPerGroup: opts.MaxClaimPerGroup,
	}
	core, err := seedcore.New(&o)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, locks: db.Collection(opts.LocksCollection), core: core, budget: claimBudget}
	for _, t := range core.Tables() {
		s.tables = append(s.tables, &table{topic: t.Topic, raw: t.Name, coll: db.Collection(t.Name)})
	}
	return s, nil
}

// Topics returns the topics of the two collections.
func (s *Store) Topics() []string { return s.core.Topics() }

// tableOf returns the collection of topic.
func (s *Store) tableOf(topic string) *table {
	for _, t := range s.tables {
		if t.topic == topic {
			return t
		}
	}
	return nil
}

// Wakeups implements outbox.Waker: a claim that stopped early (its time
// budget on a slow server, or a Store's first claim handing out its first
// documents at once) with documents left to try asks the processor to
// claim again at once rather than after its poll interval. It does not
// signal enqueues. The channel is closed when ctx ends.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} { return s.core.Wakeups(ctx.Done()) }

// Ping implements outbox.Pinger, the processor's start-up probe: the ping
// command (a one-document listing sorted by _id would read the whole
// collection on a server that sorts in memory, like FerretDB).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err(); err != nil {
		return fmt.Errorf("seedstore: ping: %w", err)
	}
	return nil
}

var (
	_ outbox.Store                     = (*Store)(nil)
	_ outbox.Enqueuer[context.Context] = (*Store)(nil)
	_ outbox.Waker                     = (*Store)(nil)
	_ outbox.Pinger                    = (*Store)(nil)
)

// DefaultLocksCollection is the collection of the claim locks (and of the
// processor's single-active lease) on MongoDB.
const DefaultLocksCollection = "outbox_processor_locks"

// writeChunk bounds the documents one write command names: FerretDB over
// PostgreSQL can deadlock its own connection pool on large write commands
// sent at once by several clients.
const writeChunk = 100

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// CheckCollectionName returns an error matching outbox.ErrInvalidInput when
// name is not a collection name New accepts: 1 to 120 bytes of UTF-8,
// no '$', no NUL, not starting with "system.".
func CheckCollectionName(name string) error {
	if err := checkCollectionName(name); err != nil {
		return outbox.InvalidParam("collection", err.Error())
	}
	return nil
}

func checkCollectionName(name string) error {
	if name == "" {
		return nil // the default
	}
	if len(name) > 120 || !utf8.ValidString(name) || strings.ContainsAny(name, "$\x00") || strings.HasPrefix(name, "system.") {
		return fmt.Errorf("%q is not a collection name (at most 120 bytes, no $ or NUL, not system.*)", name)
	}
	return nil
}

// serverNow returns the server's clock (hello's localTime), truncated to
// the millisecond as BSON dates store it. A server that does not report
// it falls back to this host's clock.
func (s *Store) serverNow(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, fmt.Errorf("seedstore: server time: %w", err)
	}
	if hello.LocalTime.IsZero() {
		hello.LocalTime = time.Now()
	}
	return hello.LocalTime.UTC().Truncate(time.Millisecond), nil
}
