// Package sqlite is the embedded default outbox store: pure-Go SQLite
// (modernc.org/sqlite, no cgo), for the quickstart, tests and small services.
//
// A Store implements outbox.Store (what the processor, webhooks and operators
// use), outbox.Enqueuer[*sql.Tx] (what outbox.Outbox uses to insert messages)
// and outbox.Waker (an in-process signal, so a processor in the same process
// claims new messages at once).
//
//	st, err := sqlite.Open(ctx, "app.db", sqlite.Options{})
//	if err != nil { ... }
//	defer st.Close()
//	if err := st.Migrate(ctx); err != nil { ... }
//
//	ob := outbox.New[*sql.Tx](st, outbox.Options{})
//	err = st.InTx(ctx, func(tx *sql.Tx) error {
//		// ... business writes in tx ...
//		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: body})
//		return err
//	}) // committed: the processor is woken at once
//
//	go outbox.Run(ctx, st, publisher, outbox.Config{})
//
// SQLite serialises writers: every write transaction of the store begins
// with BEGIN IMMEDIATE and waits for the lock up to the busy timeout, so
// several processors (goroutines or processes) on one database file are safe,
// and a claim is atomic. FIFO per group holds across them.
//
// Times are stored as integer Unix microseconds in UTC, so the times a Store
// returns are truncated to the microsecond.
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/outboxkit/outboxkit/internal/wake"
	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultTablePrefix is the prefix of the store's tables when
// Options.TablePrefix is empty: outbox_messages, outbox_attempts and
// outbox_schema_version.
const DefaultTablePrefix = "outbox_"

// DefaultClaimPerGroup is the default of Options.ClaimPerGroup.
const DefaultClaimPerGroup = 10

// DefaultBusyTimeout is how long Open's connections wait for SQLite's write
// lock before failing with SQLITE_BUSY.
const DefaultBusyTimeout = 5 * time.Second

// Options configures a Store. The zero value is valid.
type Options struct {
	// TablePrefix prefixes every table and index name. It may hold ASCII
	// letters, digits and underscores. Defaults to DefaultTablePrefix.
	TablePrefix string
	// BusyTimeout is the busy timeout of the connections Open makes (New
	// uses the caller's connections as they are). Defaults to
	// DefaultBusyTimeout.
	BusyTimeout time.Duration
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
}

// Store is the SQLite outbox store. It is safe for concurrent use. Create it
// with Open or New and call Migrate before using it.
type Store struct {
	db     *sql.DB
	ownDB  bool
	prefix string
	clock  outbox.Clock
	log    *slog.Logger
	q      queries

	wake   *wake.Hub
	mu     sync.Mutex
	cursor groupKey // where the last claim's group walk stopped

	claimPerGroup int
	writeSem      chan struct{}
}

// Compile-time checks of the ports Store implements.
var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.Enqueuer[*sql.Tx] = (*Store)(nil)
	_ outbox.Waker             = (*Store)(nil)
)

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_]*$`)

// Open opens (creating if needed) the SQLite database file at path with
// WAL journaling, a busy timeout, foreign keys on and immediate write
// transactions (_txlock=immediate, so a *sql.Tx from InTx or DB().BeginTx
// takes the write lock at BEGIN and never fails on a lock upgrade), and
// returns a Store that owns it: Close closes the database. Open does not
// migrate; call Migrate.
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
	q.Set("_txlock", "immediate")
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
	s, err := New(db, opts)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s.ownDB = true
	return s, nil
}

// New returns a Store over a database the caller opened with the
// modernc.org/sqlite driver ("sqlite"). The caller keeps ownership: Close
// does not close db. Configure db's connections with a busy timeout (e.g.
// the DSN parameter _pragma=busy_timeout(5000)) so concurrent writers wait
// for the lock instead of failing with SQLITE_BUSY; WAL mode is recommended.
// The store's own write transactions always begin with BEGIN IMMEDIATE.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	prefix := opts.TablePrefix
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if !validPrefix.MatchString(prefix) || len(prefix) > 64 {
		return nil, outbox.InvalidParam("Options.TablePrefix", "may hold only ASCII letters, digits and underscores (at most 64)")
	}
	s := &Store{
		db:       db,
		prefix:   prefix,
		clock:    opts.Clock,
		log:      opts.Logger,
		wake:     wake.New(),
		writeSem: make(chan struct{}, 1),
	}
	if s.clock == nil {
		s.clock = outbox.SystemClock
	}
	s.claimPerGroup = opts.ClaimPerGroup
	if s.claimPerGroup <= 0 {
		s.claimPerGroup = DefaultClaimPerGroup
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.q = newQueries(prefix)
	return s, nil
}

// DB returns the underlying database, for the application's own
// transactions.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes every Wakeups channel and, when the Store was made by Open,
// the database. It is safe to call more than once.
func (s *Store) Close() error {
	if !s.wake.Close() {
		return nil
	}
	if s.ownDB {
		return s.db.Close()
	}
	return nil
}

func (s *Store) now(t time.Time) time.Time {
	if t.IsZero() {
		t = s.clock.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// querier is what both *sql.Tx and *sql.Conn offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// writeTx runs fn in a BEGIN IMMEDIATE transaction on a dedicated
// connection: the write lock is taken first, so the transaction never fails
// on a lock upgrade, and concurrent writers wait up to the busy timeout.
//
// The store's own writers are also serialised in-process (writeSem), so they
// queue in Go instead of polling SQLite's lock in the busy handler, whose
// growing sleeps would otherwise throttle several processors sharing one
// Store.
func (s *Store) writeTx(ctx context.Context, fn func(q querier) error) (err error) {
	select {
	case s.writeSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.writeSem }()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlite: connection: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Roll back even when ctx is done. A failed rollback leaves the
		// connection in an unknown state: throw it away.
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil &&
			!strings.Contains(rerr.Error(), "no transaction is active") {
			s.log.Warn("sqlite: rollback failed; discarding connection", "err", rerr)
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	if err := fn(conn); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("sqlite: commit: %w", err)
	}
	committed = true
	return nil
}

// InTx runs fn in a new transaction of the store's database and commits it
// when fn returns nil (rolls back otherwise), then wakes the processors
// listening on Wakeups, so messages enqueued in fn with
// outbox.Outbox.EnqueueTx are claimed at once instead of at the next poll.
//
//	err := st.InTx(ctx, func(tx *sql.Tx) error {
//		if _, err := tx.ExecContext(ctx, "UPDATE orders SET ..."); err != nil {
//			return err
//		}
//		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: body})
//		return err
//	})
func (s *Store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: commit: %w", err)
	}
	s.Notify()
	return nil
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
