// Package seedstore is an outbox.Store over the outbox tables of seed 004
// (the FlowCatalyst outbox processor) in PostgreSQL (New), MySQL 8 /
// MariaDB 10.6+ (NewMySQL) or MongoDB (NewMongo, the seed's collections):
// outbox_events and
// outbox_dispatch_jobs, exactly as the seed defines them and as
// applications in any language write them, so that outboxkit's processor
// can replace the seed's.
//
//	CREATE TABLE outbox_events (
//	    id VARCHAR(13) PRIMARY KEY,       -- a TSID
//	    type VARCHAR(20) NOT NULL,        -- EVENT or DISPATCH_JOB
//	    message_group VARCHAR(255),       -- FIFO key, NULL = the group "default"
//	    payload TEXT NOT NULL,            -- the JSON item
//	    status VARCHAR(20) NOT NULL,      -- PENDING, PROCESSING, COMPLETED, FAILED
//	    retry_count INT NOT NULL DEFAULT 0,
//	    created_at TIMESTAMP NOT NULL,
//	    processed_at TIMESTAMP,
//	    error_message TEXT
//	);
//
// # Mapping
//
// The table decides the topic: rows of the events table are messages of
// topic flowcatalyst.TopicEvent, rows of the dispatch-jobs table of
// flowcatalyst.TopicDispatchJob. message_group is the group (NULL is the
// group "default", as in the seed; Options.UnorderedNullGroup sends NULL
// rows unordered instead), payload the Payload (sent verbatim; a payload that is
// not JSON fails permanently), created_at the CreatedAt and the order of a
// group (ties broken by id), COMPLETED is outbox's SENT. Every message has
// tenant "". Attempts is retry_count + 1 while a row is PROCESSING.
//
// The seed's columns are used as the seed uses them, plus one convention:
//
//   - processed_at is written from the database's clock (NOW(), in UTC), as
//     in the seed, so processors on hosts with skewed clocks agree;
//   - processed_at of a PROCESSING row is the claim time (the lease); of a
//     COMPLETED or FAILED row the time it finished, as in the seed;
//   - processed_at of a PENDING row, when set, is the time it may be retried
//     (the backoff; the seed's tables have no next-attempt column);
//     applications insert rows with processed_at NULL (due at once). A seed
//     processor running alongside simply ignores the delay;
//   - retry_count counts failed attempts (a retry adds one; a dead letter
//     leaves it, as in the seed; a recovered lease does not, as in the seed,
//     unless Options.RecoveryCountsAttempt); error_message holds the last
//     error as "code: message".
//
// # FIFO
//
// Claims keep FIFO per (table, message_group) with any number of processors:
// a row is claimed only when every earlier unfinished row of its group
// (PENDING, including one waiting for a retry, or PROCESSING) is claimed in
// the same statement. Claims use FOR UPDATE SKIP LOCKED, so claimers never
// wait for each other. The claim finds each group's head through the seed's
// index, one probe per group, so its cost follows the rows it claims and
// the number of groups, whatever the table's statistics.
//
// # Ids
//
// Ids are unique per table, as in the seed: an event and a dispatch job may
// share one. Outcomes are matched to claims by (table, id). MessageGet,
// MessageRequeue and AttemptList, which take an id alone, look in the
// events table first.
//
// # Limits
//
// The seed tables have no owner column, no attempt history, no receipt and
// no CANCELLED status: AttemptList returns no attempts, MessageApplyReceipt
// returns outbox.ErrNotFound, MessageCancel returns errors.ErrUnsupported.
// Outcomes are fenced by the claim time (processed_at), which the Store
// remembers for the rows it claimed: outcomes must be recorded through the
// Store that claimed (the processor does this). Seq is the id's TSID value
// (0 for an id that is not a TSID); MessageList pages by it.
//
// # Enqueue
//
// Applications in any language insert rows with plain SQL. Go code may use
// Insert, or outbox.New[*sql.Tx](store, ...): the Store is an
// outbox.Enqueuer[*sql.Tx] (see MessageEnqueueTx for how a Message maps to
// a row).
//
// # Conformance
//
// The Store passes outboxkit's store conformance suite
// (outbox/outboxtest/storetest) with these capabilities declared lacking:
// tenants, idempotency keys, cancel, attempt history, caller-chosen IDs
// longer than 13 characters, receipts, inbox, wake-ups, list-in-tx, admin
// and the caller's clock (times are the database's); its two topics are
// declared in Features.Topics.
package seedstore

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// DB is what the Store needs of a database handle; *sql.DB has it. For New
// the driver must be PostgreSQL's (e.g. github.com/jackc/pgx/v5/stdlib) and
// accept Go slices as array parameters; for NewMySQL it must be
// github.com/go-sql-driver/mysql, see NewMySQL.
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Default table names, as in seed 004.
const (
	DefaultEventsTable       = "outbox_events"
	DefaultDispatchJobsTable = "outbox_dispatch_jobs"
)

// Seed statuses.
const (
	StatusPending    = "PENDING"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Options configures a Store.
type Options struct {
	// EventsTable is the table of EVENT items, optionally schema-qualified
	// ("app.outbox_events"). Defaults to "outbox_events".
	EventsTable string
	// DispatchJobsTable is the table of DISPATCH_JOB items. Defaults to
	// "outbox_dispatch_jobs".
	DispatchJobsTable string
	// Logger defaults to discarding.
	Logger *slog.Logger

	// UnorderedNullGroup sends rows whose message_group is NULL without
	// FIFO, in parallel. By default they form one FIFO group, reported as
	// Group "default", as in the seed (messageGroup ?? "default").
	UnorderedNullGroup bool
	// RecoveryCountsAttempt makes recovery of a stuck PROCESSING row count
	// the lost attempt in retry_count, and mark the row FAILED when that
	// was its last one (a row that crashes its processor then stops being
	// retried). By default recovery leaves retry_count alone, as in the
	// seed: "no lost messages, just delayed".
	RecoveryCountsAttempt bool
	// MaxClaimPerGroup is the most rows of one group claimed at once;
	// 0 (the default) means up to the claim's limit. A group is not claimed
	// again while rows of it are in flight, so a small value bounds the
	// group's rate to MaxClaimPerGroup rows per poll.
	MaxClaimPerGroup int
	// LocksCollection is the collection of the claim locks of a MongoDB
	// Store (NewMongo); unused on SQL databases. Defaults to
	// "outbox_processor_locks".
	LocksCollection string
}

// DefaultNullGroup is the group of rows whose message_group is NULL, as in
// the seed.
const DefaultNullGroup = "default"

type table struct {
	topic string
	name  string // quoted, possibly qualified
	raw   string
	sql   statements
	my    mysqlStatements

	coll      *mongo.Collection // NewMongo
	lastGroup *string           // NewMongo: the group claimed last (round robin); guarded by Store.mu
	groupsFit bool              // NewMongo: the last claim saw every unfinished document; guarded by Store.mu
}

// dialect is the database a Store works on.
type dialect int

const (
	dialectPostgres dialect = iota
	dialectMySQL
	dialectMongo
)

// Store is an outbox.Store over seed 004's tables. It is safe for
// concurrent use.
type Store struct {
	db     DB
	mysql  bool     // the MySQL/MariaDB dialect (NewMySQL)
	mg     *mongoDB // MongoDB (NewMongo); db is nil then
	tables []*table // events, dispatch jobs
	log    *slog.Logger

	unorderedNull  bool
	recoveryCounts bool
	chunk          int

	wake chan struct{} // Wakeups (MongoDB)

	mu       sync.Mutex
	leases   map[leaseKey]lease
	leaseGen uint64 // the last lease.gen handed out

	beforeForget func() // tests: runs between a finish's commit and its forget
	turn         int
	lastCreated  time.Time // MessageEnqueue: the latest created_at written
}

type leaseKey struct{ topic, id string }

type lease struct {
	claimedAt time.Time
	attempt   int
	// gen tells this claim of the row from a later one: a finish forgets
	// only the leases it used, not the new lease of a row claimed again
	// between its commit and its forget (a retry due at once).
	gen uint64
}

// heldLease is a lease a finish used, for forget.
type heldLease struct {
	key leaseKey
	gen uint64
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

func quoteIdent(name string) (string, error) { return quoteIdentWith(name, `"`) }

func quoteIdentWith(name, quote string) (string, error) {
	if !identRE.MatchString(name) {
		return "", fmt.Errorf("%q is not a table name (letters, digits and _, optionally schema.table)", name)
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = quote + p + quote
	}
	return strings.Join(parts, "."), nil
}

// CheckTableName returns an error matching outbox.ErrInvalidInput when name
// is not a table name the Store accepts: letters, digits and _, optionally
// schema-qualified (schema.table).
func CheckTableName(name string) error {
	if _, err := quoteIdent(name); err != nil {
		return outbox.InvalidParam("table", err.Error())
	}
	return nil
}

// New returns a Store over db, a PostgreSQL database. It does not touch the
// database; see CreateTables.
func New(db DB, opts Options) (*Store, error) { return newStore(db, opts, dialectPostgres) }

func newStore(db DB, opts Options, d dialect) (*Store, error) {
	if db == nil && d != dialectMongo {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	mysql := d == dialectMySQL
	if opts.EventsTable == "" {
		opts.EventsTable = DefaultEventsTable
	}
	if opts.DispatchJobsTable == "" {
		opts.DispatchJobsTable = DefaultDispatchJobsTable
	}
	if strings.EqualFold(opts.EventsTable, opts.DispatchJobsTable) {
		return nil, outbox.InvalidParam("Options.DispatchJobsTable", "must differ from EventsTable")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxClaimPerGroup < 0 || opts.MaxClaimPerGroup > outbox.MaxClaimLimit {
		return nil, outbox.InvalidParam("Options.MaxClaimPerGroup", fmt.Sprintf("must be between 0 (default) and %d", outbox.MaxClaimLimit))
	}
	if opts.MaxClaimPerGroup == 0 {
		opts.MaxClaimPerGroup = outbox.MaxClaimLimit
	}
	s := &Store{db: db, mysql: mysql, log: opts.Logger, leases: map[leaseKey]lease{},
		unorderedNull: opts.UnorderedNullGroup, recoveryCounts: opts.RecoveryCountsAttempt, chunk: opts.MaxClaimPerGroup,
		wake: make(chan struct{}, 1)}
	for _, t := range []struct{ topic, name, field string }{
		{flowcatalyst.TopicEvent, opts.EventsTable, "Options.EventsTable"},
		{flowcatalyst.TopicDispatchJob, opts.DispatchJobsTable, "Options.DispatchJobsTable"},
	} {
		quote := `"`
		if mysql {
			quote = "`"
		}
		if d == dialectMongo {
			s.tables = append(s.tables, &table{topic: t.topic, name: t.name, raw: t.name})
			continue
		}
		q, err := quoteIdentWith(t.name, quote)
		if err != nil {
			return nil, outbox.InvalidParam(t.field, err.Error())
		}
		tb := &table{topic: t.topic, name: q, raw: t.name}
		if mysql {
			tb.sql, tb.my = buildMySQLStatements(q)
		} else {
			tb.sql = buildStatements(q)
		}
		s.tables = append(s.tables, tb)
	}
	return s, nil
}

// Topics returns the topics of the two tables.
func (s *Store) Topics() []string {
	return []string{s.tables[0].topic, s.tables[1].topic}
}

// CreateTables creates the two tables and their indexes, as seed 004
// defines them, when they do not exist yet.
//
// On MongoDB (NewMongo) it creates the seed's index on both collections
// (collections come into being with their first document).
func (s *Store) CreateTables(ctx context.Context) error {
	if s.mg != nil {
		return s.createTablesMongo(ctx)
	}
	if s.mysql {
		return s.createTablesMySQL(ctx)
	}
	for _, t := range s.tables {
		idx := "idx_" + strings.ReplaceAll(t.raw, ".", "_") + "_status"
		if i := strings.LastIndex(t.raw, "."); i >= 0 {
			idx = "idx_" + t.raw[i+1:] + "_status"
		}
		ddl := `CREATE TABLE IF NOT EXISTS ` + t.name + ` (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
);
CREATE INDEX IF NOT EXISTS "` + idx + `" ON ` + t.name + `(status, message_group, created_at)`
		for _, stmt := range strings.Split(ddl, ";\n") {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("seedstore: create %s: %w", t.raw, err)
			}
		}
	}
	return nil
}

func (s *Store) tablesFor(topics []string) ([]*table, error) {
	if len(topics) == 0 {
		return s.tables, nil
	}
	var out []*table
	for _, t := range s.tables {
		for _, want := range topics {
			if want == "" {
				return nil, outbox.InvalidParam("Topics", "contains an empty topic")
			}
			if want == t.topic {
				out = append(out, t)
				break
			}
		}
	}
	return out, nil
}

func (s *Store) tableOf(topic string) *table {
	for _, t := range s.tables {
		if t.topic == topic {
			return t
		}
	}
	return nil
}

// at returns t as the store writes it: UTC, truncated to the microsecond
// (TIMESTAMP's precision), so a fence compares equal.
func at(t time.Time) time.Time {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// groupOf maps message_group to the message's Group.
func (s *Store) groupOf(g sql.NullString) string {
	if !g.Valid && !s.unorderedNull {
		return DefaultNullGroup
	}
	return g.String
}
