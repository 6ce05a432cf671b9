package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/surface"
	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultTablePrefix is the prefix of the store's tables and indexes when
// Options.TablePrefix is empty: outbox_messages, outbox_attempts,
// outbox_migrations and the others.
const DefaultTablePrefix = "outbox_"

// DefaultClaimPerGroup is the default of Options.ClaimPerGroup.
const DefaultClaimPerGroup = 100

// DB is what the store needs from a database handle: *pgxpool.Pool
// satisfies it (recommended), and so does a *pgx.Conn used by one goroutine
// at a time.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// acquirer is the optional capability of a DB that can lend a dedicated
// connection (*pgxpool.Pool). The listener and the elector use it when
// Options.Connect is nil.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Options configures a Store. The zero value is valid.
type Options struct {
	// Schema holds the outbox tables. It must be a lowercase SQL identifier
	// ([a-z_][a-z0-9_]*). Migrate creates it when missing. Defaults to
	// "public".
	Schema string
	// TablePrefix starts every table and index name (<prefix>messages,
	// <prefix>attempts, <prefix>migrations). It must be "" or a lowercase
	// identifier fragment ([a-z_][a-z0-9_]*). Defaults to
	// DefaultTablePrefix.
	TablePrefix string
	// Clock supplies the time when a Params struct has no Now. Defaults to
	// outbox.SystemClock.
	Clock outbox.Clock
	// Logger receives the store's few log lines (listener fallback and
	// reconnects, leadership changes). It never receives payloads or
	// connection strings. Defaults to discarding.
	Logger *slog.Logger
	// Connect opens a dedicated connection for LISTEN (Wakeups) and for
	// leader election (Elector). Defaults to taking one out of the DB when
	// it is a *pgxpool.Pool; with any other DB and no Connect, Wakeups
	// falls back to polling and Elector.Run returns an error.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// ClaimPerGroup caps how many messages of one group a single claim
	// takes (the group's oldest due messages, in order). Larger runs make
	// bigger publish batches; smaller runs spread a claim over more groups.
	// Defaults to DefaultClaimPerGroup.
	ClaimPerGroup int
	// AsyncCommit makes claims, outcomes and lease recovery commit without
	// waiting for their WAL flush (synchronous_commit = off for those
	// statements only; enqueues, receipts and operator actions stay
	// durable). It multiplies what a processor can record on a disk with
	// slow fsync. The cost: if PostgreSQL itself crashes, the last fraction
	// of a second of claims and outcomes is forgotten, so those messages are
	// published again (at-least-once, in group order); nothing is lost.
	// Defaults to false.
	AsyncCommit bool
	// DisableNotify stops Enqueue from calling pg_notify. Wakeups then only
	// polls. Defaults to false: an enqueue that inserts notifies when a
	// listener (Wakeups) is idle; while listeners are short-polling because
	// messages keep arriving, enqueues skip NOTIFY (see Wakeups).
	DisableNotify bool
	// DeleteSentTopics lists topics whose messages are deleted when they
	// are sent instead of kept as SENT: the outcome then writes no new row
	// version and no index entry (about half of the work the store does per
	// drained message; see PERFORMANCE.md, "Write path"). It suits topics
	// that need no record of what was sent. After a message of such a topic
	// is sent: MessageGet and AttemptList report outbox.ErrNotFound and
	// nothing, MessageApplyReceipt finds nothing (outbox.ErrNotFound: do not
	// use it for topics whose provider sends receipts), MessageCount and the
	// admin statistics do not count it, and its idempotency key is free
	// again (an Enqueue with the same key inserts a new message), as after
	// MessagePrune. Its attempt history goes with it. Dead letters and
	// cancelled messages of these topics are kept as usual. Defaults to
	// none.
	DeleteSentTopics []string
	// AppendOnly stores the progress of messages as marks per group run
	// (claims and outcomes insert rows into <prefix>marks) instead of
	// updating each message row twice, so a transaction that holds the
	// cleanup horizon (a long report, an idle-in-transaction session, a
	// lagging replication slot) does not slow claims down with dead row
	// versions (see LOG-DESIGN.md and PERFORMANCE.md). Experimental: it
	// will become the default.
	//
	// Every process on the database must agree. Migrate records the
	// setting in the database, and a store whose AppendOnly differs from
	// the record refuses to start (Ping, which outbox.Run calls first,
	// returns ErrStorageMode): a store on the default path would take the
	// messages the marks finished as still PENDING. To leave append-only
	// storage, stop every processor and migrate to version 13
	// (MigrateTo), which writes the marks' states into the message rows.
	// Defaults to false.
	AppendOnly bool
}

// ErrStorageMode is returned by Ping and Migrate when Options.AppendOnly
// differs from what the database records.
var ErrStorageMode = errors.New("postgres: Options.AppendOnly does not match the database's storage")

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Store is the PostgreSQL outbox store. It implements outbox.Store,
// outbox.Enqueuer[pgx.Tx] and outbox.Waker; SQL returns an
// outbox.Enqueuer[*sql.Tx] for database/sql users. A Store is safe for
// concurrent use.
type Store struct {
	db     DB
	clock  outbox.Clock
	log    *slog.Logger
	opts   Options
	schema string
	prefix string

	messages   string // qualified table names
	attempts   string
	pauses     string
	migrations string
	channel    string // NOTIFY channel
	groupNS    int32  // advisory lock namespace of group enqueue locks
	notifyKey  int64  // advisory lock key of notification coalescing (notify.go)
	adminNS    int32  // advisory lock namespace of Migrate and Elector

	sql sqlText

	pruned atomic.Int64 // rows pruned since the store last analysed the tables
	// smallClaims is set while this store's claims return few messages:
	// the next claim then runs its generic plan (see claimSettings).
	smallClaims atomic.Bool
	tids        tidCache    // tuple IDs of the rows this store leased
	windows     windowLows  // where claim windows start (claim.go)
	floors      groupFloors // where a claim's lookups of a group start (floors.go)
	fair        fairShare   // when claims look at other tenants (fair.go)

	// The append-only path (logmode.go), while it is built.
	logMode bool
	lsql    logSQL
	lread   sqlText // the read statements, over the state view
	logc    logClaimer
	// logKnown is the group of each message this store claimed on the
	// append-only path and has not finished.
	logKnown logKnown
	// logReg is the ordered groups this store knows the registry holds
	// (see logRegistered).
	logReg logRegistered
	// wakers is the channel of every Wakeups call still running: the
	// append-only path wakes its processors itself (logMarginWake).
	wakers wakerSet
	// deleteSent is Options.DeleteSentTopics as a set.
	deleteSent map[string]bool
}

// Store has the method set of every store: the ports, InTx,
// MessageListTx and the migration API.
var _ surface.Store[pgx.Tx] = (*Store)(nil)

// New returns a Store over db. It does not touch the database; call Migrate
// (or apply Migrations with your own tool) before use.
func New(db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if opts.Schema == "" {
		opts.Schema = "public"
	}
	if opts.TablePrefix == "" {
		opts.TablePrefix = DefaultTablePrefix
	}
	if !identRE.MatchString(opts.Schema) || len(opts.Schema) > 63 {
		return nil, outbox.InvalidParam("Schema", "must be a lowercase identifier ([a-z_][a-z0-9_]*, at most 63 bytes)")
	}
	if !identRE.MatchString(opts.TablePrefix) || len(opts.TablePrefix) > 30 {
		return nil, outbox.InvalidParam("TablePrefix", "must be a lowercase identifier fragment ([a-z_][a-z0-9_]*, at most 30 bytes)")
	}
	for _, t := range opts.DeleteSentTopics {
		if t == "" || len(t) > outbox.MaxKeyLength {
			return nil, outbox.InvalidParam("DeleteSentTopics", fmt.Sprintf("topics must be 1 to %d bytes", outbox.MaxKeyLength))
		}
	}
	opts.DeleteSentTopics = texts(opts.DeleteSentTopics)
	if opts.ClaimPerGroup < 0 {
		return nil, outbox.InvalidParam("ClaimPerGroup", "must not be negative")
	}
	if opts.ClaimPerGroup == 0 {
		opts.ClaimPerGroup = DefaultClaimPerGroup
	}
	if opts.Clock == nil {
		opts.Clock = outbox.SystemClock
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Store{
		db:     db,
		clock:  opts.Clock,
		log:    opts.Logger,
		opts:   opts,
		schema: opts.Schema,
		prefix: opts.TablePrefix,
	}
	s.windows.margin, s.windows.rescan = windowMargin, windowRescan
	s.fair.every = fairEvery
	s.messages = s.schema + "." + s.prefix + "messages"
	s.attempts = s.schema + "." + s.prefix + "attempts"
	s.pauses = s.schema + "." + s.prefix + "pauses"
	s.migrations = s.schema + "." + s.prefix + "migrations"
	s.channel = s.schema + "." + s.prefix + "messages"
	if len(s.channel) > 63 {
		s.channel = s.channel[:63]
	}
	s.groupNS = ns(s.messages + ":group")
	s.notifyKey = notifyKeyOf(s.channel)
	s.adminNS = ns(s.messages + ":admin")
	s.sql = buildSQL(s)
	if opts.AppendOnly {
		s.enableLogMode()
	}
	return s, nil
}

// ns derives a 32-bit advisory lock namespace from a name, so that two
// outboxes in one database (other schema or prefix) never share locks.
func ns(name string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte("outboxkit:" + name))
	return int32(h.Sum32()) //nolint:gosec // a hash, wrapping is intended
}

// Advisory lock keys inside adminNS.
const (
	lockMigrate int32 = 1
	lockLeader  int32 = 2
)

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// MessagesTable returns the qualified name of the messages table
// (schema.prefixmessages), for operators' own queries.
func (s *Store) MessagesTable() string { return s.messages }

// AttemptsTable returns the qualified name of the attempts table.
func (s *Store) AttemptsTable() string { return s.attempts }

// at returns t in UTC truncated to PostgreSQL's microsecond precision, or
// the store clock's time when t is zero.
func (s *Store) at(t time.Time) time.Time {
	if t.IsZero() {
		t = s.clock.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// dedicated opens a connection the caller owns (closes) for LISTEN or a
// session advisory lock.
func (s *Store) dedicated(ctx context.Context) (*pgx.Conn, error) {
	if s.opts.Connect != nil {
		return s.opts.Connect(ctx)
	}
	a, ok := s.db.(acquirer)
	if !ok {
		return nil, errNoDedicated
	}
	c, err := a.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// The connection leaves the pool for good: LISTEN and session locks
	// must not leak into other users of the pool.
	return c.Hijack(), nil
}

var errNoDedicated = errors.New("postgres: no dedicated connection: DB is not a *pgxpool.Pool and Options.Connect is nil")

// wrapErr adds the operation name to a database error.
func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

// InTx runs fn in a new transaction of the store's database and commits it
// when fn returns nil (rolls back otherwise). Messages enqueued in fn with
// outbox.Outbox.EnqueueTx wake the processors when tx commits (NOTIFY is
// delivered at commit), unless Options.DisableNotify is set.
//
//	err := st.InTx(ctx, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "UPDATE orders SET ..."); err != nil {
//			return err
//		}
//		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: body})
//		return err
//	})
func (s *Store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return wrapErr("begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return wrapErr("commit", err)
	}
	return nil
}

// Ping implements outbox.Pinger: it checks that the server answers, that
// the store's tables exist (an error matching outbox.ErrNotMigrated, and
// wrapping the server's SQLSTATE 42P01, when Migrate has not run) and that
// Options.AppendOnly matches the database's storage (ErrStorageMode),
// without reading a message.
func (s *Store) Ping(ctx context.Context) error {
	q := "SELECT NULL FROM " + s.messages + " LIMIT 0"
	if s.logMode {
		q = "(" + q + ") UNION ALL (SELECT NULL FROM " + s.marksTable() + " LIMIT 0)"
	}
	if _, err := s.db.Exec(ctx, q); err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42P01" {
			return fmt.Errorf("postgres: ping: %w (%w)", outbox.ErrNotMigrated, err)
		}
		return wrapErr("ping", err)
	}
	return s.checkStorage(ctx, false)
}

// storageAppendOnly is the settings row of Options.AppendOnly.
const storageAppendOnly = "append-only"

// checkStorage compares Options.AppendOnly with the database's record (the
// settings table of migration 14), after recording it when record is set
// and nothing is recorded yet. A database before migration 14 records
// nothing: a store with AppendOnly refuses it.
func (s *Store) checkStorage(ctx context.Context, record bool) error {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.settingsTable()).Scan(&exists); err != nil {
		return wrapErr("storage mode", err)
	}
	if !exists {
		if s.opts.AppendOnly {
			return fmt.Errorf("%w: the database records no storage mode (schema before version 14): run Migrate", ErrStorageMode)
		}
		return nil
	}
	if record && s.opts.AppendOnly {
		// Recorded for the first time: the groups of the messages that
		// default-path stores enqueued since migration 13 filled the
		// registry join it (prune, fair share and the backstop read the
		// registry's groups).
		if _, err := s.db.Exec(ctx, `WITH rec AS (
	INSERT INTO `+s.settingsTable()+` (name, value) VALUES ('storage', $1) ON CONFLICT DO NOTHING RETURNING 1
)
INSERT INTO `+s.groupsTable()+` (tenant, topic, grp)
SELECT DISTINCT tenant, topic, grp FROM `+s.messages+` WHERE grp <> '' AND EXISTS (SELECT 1 FROM rec)
ON CONFLICT DO NOTHING`, storageAppendOnly); err != nil {
			return wrapErr("storage mode", err)
		}
	}
	var mode string
	err := s.db.QueryRow(ctx, `SELECT value FROM `+s.settingsTable()+` WHERE name = 'storage'`).Scan(&mode)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return wrapErr("storage mode", err)
	}
	switch {
	case s.opts.AppendOnly && mode != storageAppendOnly:
		return fmt.Errorf("%w: the store has AppendOnly set and the database is not append-only: run Migrate with it", ErrStorageMode)
	case !s.opts.AppendOnly && mode == storageAppendOnly:
		return fmt.Errorf("%w: the database's storage is append-only: set Options.AppendOnly in every process (or stop them all and migrate to version 13 to leave it)", ErrStorageMode)
	}
	return nil
}

// settingsTable is the settings table of migration 14.
func (s *Store) settingsTable() string { return s.schema + "." + s.prefix + "settings" }
