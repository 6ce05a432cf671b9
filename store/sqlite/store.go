package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/internal/surface"
	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultTablePrefix is the prefix of the store's tables when
// Options.TablePrefix is empty: outbox_messages, outbox_attempts and
// outbox_schema_version.
const DefaultTablePrefix = "outbox_"

// DefaultClaimPerGroup is the default of Options.ClaimPerGroup. It is 10,
// where store/postgres's is 100: on this store a run of 100 was not
// measurably faster in a drain (see the CHANGELOG), while a short run
// spreads a claim over more groups and leaves fewer messages to release
// when a failure blocks a group.
const DefaultClaimPerGroup = 10

// DefaultBusyTimeout is how long Open's connections wait for SQLite's write
// lock before failing with SQLITE_BUSY.
const DefaultBusyTimeout = 5 * time.Second

// Options configures a Store. The zero value is valid.
type Options struct {
	// TablePrefix prefixes every table and index name. It may hold ASCII
	// letters, digits and underscores. Defaults to DefaultTablePrefix.
	TablePrefix string
	// ClaimPerGroup is the most messages of one ordered group a claim takes
	// while other groups have claimable messages too; a claim that finds
	// fewer than its Limit takes more of the groups it cut. Keeping it small
	// spreads a claim over groups and keeps few messages to release when a
	// failure blocks a group. Defaults to DefaultClaimPerGroup.
	ClaimPerGroup int
	// Clock stamps the store's writes when a call's Params carry no Now.
	// Defaults to outbox.SystemClock.
	Clock outbox.Clock
	// Logger receives the store's logs. Defaults to discarding them.
	Logger *slog.Logger
	// BusyTimeout is the busy timeout of the connections Open makes (New
	// uses the caller's connections as they are). Defaults to
	// DefaultBusyTimeout.
	BusyTimeout time.Duration
}

// The Store's methods that the shared code does are generated into
// methods.go from one template for store/mysql and store/sqlite.
//
//go:generate go run ../../internal/sqlstore/genmethods -pkg sqlite

// Store is the SQLite outbox store. It is safe for concurrent use. Create it
// with Open or New and call Migrate before using it.
type Store struct {
	// core is the database/sql code this store shares with store/mysql;
	// the methods that call it say what it does for this store.
	core *sqlstore.Store
	d    *dialect
}

// dialect is this store's own code, which the shared code calls through
// sqlstore.Dialect: its transactions, insert, claim and batch of outcomes.
type dialect struct {
	db       *sql.DB
	writeSem chan struct{} // serialises the store's writers in-process
	env      sqlstore.Env
	q        queries

	mu     sync.Mutex
	cursor groupKey // where the last claim's group walk stopped
}

// Store has the method set of every store (the ports, InTx, MessageListTx
// and the migration API), and DB, Close and Notify; its dialect is the
// shared code's.
var (
	_ surface.Store[*sql.Tx] = (*Store)(nil)
	_ surface.SQL            = (*Store)(nil)
	_ outbox.Admin           = (*Store)(nil)
	_ sqlstore.Dialect       = (*dialect)(nil)
)

// syntax is how SQLite's SQL text differs from MySQL's in the shared code.
var syntax = sqlstore.Syntax{
	Name:     "sqlite",
	Time:     func(t time.Time) any { return t.UnixMicro() },
	Text:     func(b []byte) any { return string(b) },
	Earliest: func(col string) string { return "MIN(" + col + ", ?)" },
	DeleteOldest: func(table, col string) string {
		return `DELETE FROM ` + table + ` WHERE rowid IN (
			SELECT rowid FROM ` + table + ` WHERE ` + col + ` < ? ORDER BY ` + col + ` LIMIT ?)`
	},
	VersionTable: func(table string) string {
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (
			version    INTEGER PRIMARY KEY,
			name       TEXT    NOT NULL,
			applied_at INTEGER NOT NULL)`
	},
	TableExists: `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`,
	MaxPrefix:   64,
	// SQLite holds values up to 1 GB; 64 MiB bounds what one message
	// makes the processor hold in memory.
	MaxPayload:    64 << 20,
	InboxInsert:   inboxInsert,
	InboxInserted: inboxInserted,
}

// Open opens (creating if needed) the SQLite database file at path with
// WAL journaling, a busy timeout and foreign keys on, and returns a Store
// that owns it: Close closes the database. Open does not migrate; call
// Migrate.
//
// The store's own writes (claims, outcomes, recovery) begin with BEGIN
// IMMEDIATE, and so do the transactions of InTx: they take SQLite's single
// write lock at BEGIN (waiting up to the busy timeout), so a transaction
// that reads, then writes, never fails on a lock upgrade. Keep them short:
// the processor's writes wait while one is open. A transaction from
// DB().BeginTx is SQLite's default, deferred: it takes the write lock at its
// first write, so one that begins and computes first does not stall the
// processors; but if it read before another writer committed, its first
// write fails with SQLITE_BUSY (retry it, or write first). Use InTx for
// transactions that enqueue unless you have that reason.
//
// path is a file name; an in-memory database (":memory:") is refused because
// each pooled connection would see a different, empty database.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if path == "" || path == ":memory:" || strings.Contains(path, "mode=memory") {
		return nil, outbox.InvalidParam("path", "must name a database file (in-memory databases are not shared between connections)")
	}
	bt := opts.BusyTimeout
	if bt <= 0 {
		bt = DefaultBusyTimeout
	}
	if strings.ContainsAny(path, "?#") {
		return nil, outbox.InvalidParam("path", "must be a plain file name without '?' or '#'")
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", bt.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	dsn := path + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// Keep connections: opening one re-reads the schema and re-runs the
	// pragmas, and the default of 2 idle connections would churn them.
	db.SetMaxIdleConns(16)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	q.Set("_txlock", "immediate")
	txdb, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	txdb.SetMaxIdleConns(4)
	s, err := newStore(db, opts, txdb)
	if err != nil {
		_ = txdb.Close()
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// New returns a Store over a database the caller opened with the
// modernc.org/sqlite driver ("sqlite"). The caller keeps ownership: Close
// does not close db. Configure db's connections with a busy timeout (e.g.
// the DSN parameter _pragma=busy_timeout(5000)) so concurrent writers wait
// for the lock instead of failing with SQLITE_BUSY; WAL mode is recommended.
// The store's own write transactions always begin with BEGIN IMMEDIATE.
// InTx begins its transactions on db as configured (for IMMEDIATE ones, open
// db with the DSN parameter _txlock=immediate).
func New(db *sql.DB, opts Options) (*Store, error) { return newStore(db, opts, nil) }

// newStore makes a Store over db; a non-nil txdb (from Open) is the pool of
// InTx's IMMEDIATE transactions, and means the store owns both.
func newStore(db *sql.DB, opts Options, txdb *sql.DB) (*Store, error) {
	env, err := sqlstore.Options{
		TablePrefix: cmp.Or(opts.TablePrefix, DefaultTablePrefix), ClaimPerGroup: cmp.Or(opts.ClaimPerGroup, DefaultClaimPerGroup),
		Clock: opts.Clock, Logger: opts.Logger,
	}.Env(syntax)
	if err != nil {
		return nil, err
	}
	d := &dialect{db: db, writeSem: make(chan struct{}, 1), env: env, q: newQueries(env.Prefix)}
	core, err := sqlstore.New(sqlstore.Config{
		DB: db, TxDB: txdb, OwnDB: txdb != nil, Env: env, Syntax: syntax, Dialect: d, MigrationFS: migrationFS,
	})
	if err != nil {
		return nil, err
	}
	return &Store{core: core, d: d}, nil
}

// WriteTx runs fn in a BEGIN IMMEDIATE transaction on a dedicated
// connection: the write lock is taken first, so the transaction never fails
// on a lock upgrade, and concurrent writers wait up to the busy timeout.
//
// The store's own writers are also serialised in-process (writeSem), so they
// queue in Go instead of polling SQLite's lock in the busy handler, whose
// growing sleeps would otherwise throttle several processors sharing one
// Store.
func (d *dialect) WriteTx(ctx context.Context, fn func(q sqlstore.Querier) error) (err error) {
	select {
	case d.writeSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-d.writeSem }()
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlite: connection: %w", err)
	}
	defer conn.Close()
	committed := false
	defer func() {
		if committed {
			return
		}
		// Roll back even when ctx is done, and also when BEGIN itself
		// reported an error: a cancelled ctx can interrupt the statement
		// after the transaction began, and a connection handed back to the
		// pool inside a transaction fails every later BEGIN on it. A failed
		// rollback leaves the connection in an unknown state: throw it away.
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil &&
			!strings.Contains(rerr.Error(), "no transaction is active") {
			d.env.Log.Warn("sqlite: rollback failed; discarding connection", "err", rerr)
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	if err := fn(conn); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("sqlite: commit: %w", err)
	}
	committed = true
	return nil
}

// queries holds the SQL that names tables, rendered once for a prefix.
type queries struct {
	messages, attempts, pauses string

	insert, selectByKey                     string
	claimUnordered, claimUnorderedTopics    string
	nextGroupHead, groupPrefix, claimUpdate string
	sent, retry, dead, release              string
}

func newQueries(prefix string) queries {
	m, a := prefix+"messages", prefix+"attempts"
	q := queries{messages: m, attempts: a, pauses: prefix + "pauses"}
	q.insert = `INSERT INTO ` + m + ` (id, tenant, topic, grp, idempotency_key, payload, content_type, headers, status,
		attempts, max_attempts, next_attempt_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, ?, ?, ?, ?)
		ON CONFLICT DO NOTHING
		RETURNING ` + sqlstore.MessageCols
	q.selectByKey = `SELECT ` + sqlstore.MessageCols + ` FROM ` + m + ` WHERE tenant = ? AND idempotency_key = ?`

	// The claim reads due unordered messages in seq order, and walks the
	// groups (one index seek per group with open messages) to read the
	// claimable prefix of each: the group's open messages from its head up
	// to the first one that is PROCESSING, not yet due, or a dead letter
	// that blocks its group (blocks_group: open like a waiting retry).
	// Paused topics are skipped (outbox.Admin).
	notPaused := adminsql.NotPaused(prefix+"pauses", "")
	q.claimUnordered = `SELECT seq FROM ` + m + ` WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?` + notPaused + `
		ORDER BY seq LIMIT ?`
	q.claimUnorderedTopics = `SELECT seq FROM ` + m + ` WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?
		AND topic IN (SELECT value FROM json_each(?))` + notPaused + ` ORDER BY seq LIMIT ?`
	q.nextGroupHead = `SELECT tenant, topic, grp, status, next_attempt_at FROM ` + m + `
		WHERE (status IN ('PENDING', 'PROCESSING') OR blocks_group = 1) AND (tenant, topic, grp) > (?, ?, ?)
		ORDER BY tenant, topic, grp, seq LIMIT 1`
	q.groupPrefix = `SELECT seq, status, next_attempt_at FROM ` + m + `
		WHERE tenant = ? AND topic = ? AND grp = ? AND (status IN ('PENDING', 'PROCESSING') OR blocks_group = 1)
		ORDER BY seq LIMIT ? OFFSET ?`
	q.claimUpdate = `UPDATE ` + m + ` SET status = 'PROCESSING', attempts = attempts + 1,
		claimed_at = ?, claimed_by = ?, updated_at = ?, claim_token = ?
		WHERE seq IN (SELECT value FROM json_each(?)) AND status = 'PENDING'
		RETURNING ` + sqlstore.MessageCols

	// IS: a NULL token (an outcome without one) matches a lease without one.
	fence := ` WHERE id = ? AND status = 'PROCESSING' AND claimed_by = ? AND attempts = ? AND claim_token IS ?`
	q.sent = `UPDATE ` + m + ` SET status = 'SENT', provider_message_id = ?, sent_at = ?, updated_at = ?,
		claimed_at = NULL, claimed_by = NULL, claim_token = NULL` + fence + ` RETURNING tenant`
	q.retry = `UPDATE ` + m + ` SET status = 'PENDING', next_attempt_at = ?, last_error_code = ?,
		last_error_message = ?, updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL` + fence + ` RETURNING tenant`
	// A dead letter recorded with BlockGroup holds its group (never one of
	// group "": there is no group to hold).
	q.dead = `UPDATE ` + m + ` SET status = 'FAILED', last_error_code = ?, last_error_message = ?,
		updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL, blocks_group = (? AND grp <> '')` + fence + ` RETURNING tenant`
	// A release with a due time is a deferral (quota, throttle): the new due
	// time and the reason are kept; a plain release keeps both as they were.
	q.release = `UPDATE ` + m + ` SET status = 'PENDING', attempts = attempts - 1, updated_at = ?,
		next_attempt_at = COALESCE(?, next_attempt_at),
		last_error_code = COALESCE(?, last_error_code), last_error_message = COALESCE(?, last_error_message),
		claimed_at = NULL, claimed_by = NULL, claim_token = NULL` + fence + ` RETURNING tenant`
	return q
}
