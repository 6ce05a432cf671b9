package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/internal/wake"
	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultTablePrefix is the prefix of the store's tables when
// Options.TablePrefix is empty: outbox_messages, outbox_attempts,
// outbox_groups and outbox_schema_version.
const DefaultTablePrefix = "outbox_"

// DefaultClaimPerGroup is the default of Options.ClaimPerGroup.
const DefaultClaimPerGroup = 10

// MaxClaimLimit is the largest MessageClaimParams.Limit the store accepts.
const MaxClaimLimit = 10000

// Options configures a Store. The zero value is valid.
type Options struct {
	// TablePrefix prefixes every table and index name. It may hold ASCII
	// letters, digits and underscores (at most 32). Defaults to
	// DefaultTablePrefix.
	TablePrefix string
	// ClaimPerGroup is the most messages of one ordered group a claim takes
	// while other groups have claimable messages too; a claim that finds
	// fewer than its Limit takes more of the groups it cut. Defaults to
	// DefaultClaimPerGroup.
	ClaimPerGroup int
	// Clock stamps the store's writes when a call's Params carry no Now.
	// Defaults to outbox.SystemClock.
	Clock outbox.Clock
	// Logger receives the store's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// Store is the MySQL/MariaDB outbox store. It is safe for concurrent use.
// Create it with New and call Migrate before using it.
type Store struct {
	db            *sql.DB
	prefix        string
	clock         outbox.Clock
	log           *slog.Logger
	claimPerGroup int
	q             queries

	wake *wake.Hub
}

// Compile-time checks of the ports Store implements.
var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.Enqueuer[*sql.Tx] = (*Store)(nil)
	_ outbox.Waker             = (*Store)(nil)
)

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_]*$`)

// New returns a Store over db, a database opened with the
// github.com/go-sql-driver/mysql driver ("mysql"). The caller keeps
// ownership of db: Close does not close it. The DSN needs no particular
// parameters: parseTime and loc may be set or not (the store reads and
// writes its DATETIME columns as UTC either way), and so may
// clientFoundRows. New does not touch the database; call Migrate.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	prefix := opts.TablePrefix
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if !validPrefix.MatchString(prefix) || len(prefix) > 32 {
		return nil, outbox.InvalidParam("Options.TablePrefix", "may hold only ASCII letters, digits and underscores (at most 32)")
	}
	if opts.ClaimPerGroup < 0 {
		return nil, outbox.InvalidParam("Options.ClaimPerGroup", "must not be negative")
	}
	s := &Store{
		db:            db,
		prefix:        prefix,
		clock:         opts.Clock,
		log:           opts.Logger,
		claimPerGroup: opts.ClaimPerGroup,
		wake:          wake.New(),
	}
	if s.clock == nil {
		s.clock = outbox.SystemClock
	}
	if s.claimPerGroup == 0 {
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

// Close closes every Wakeups channel. It does not close the database. It
// is safe to call more than once.
func (s *Store) Close() error {
	s.wake.Close()
	return nil
}

// now returns t (or the store's clock when t is zero) in UTC, truncated to
// the microsecond, the precision of DATETIME(6).
func (s *Store) now(t time.Time) time.Time {
	if t.IsZero() {
		t = s.clock.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// querier is what *sql.DB, *sql.Tx and *sql.Conn offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// txRetries is how many times a store-owned transaction is retried after
// the server chose it as a deadlock victim (or its lock wait timed out).
const txRetries = 5

// inTx runs fn in a store-owned READ COMMITTED transaction and commits it.
// A transaction the server rolled back because of a deadlock (error 1213)
// or a lock wait timeout (1205) is run again, up to txRetries times.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	var err error
	for try := 0; ; try++ {
		err = s.tryTx(ctx, fn)
		if err == nil || !retryable(err) || try >= txRetries || ctx.Err() != nil {
			return err
		}
		s.log.DebugContext(ctx, "outboxkit/mysql: retrying a transaction", "err", err, "try", try+1)
		time.Sleep(time.Duration(try+1) * 5 * time.Millisecond)
	}
}

func (s *Store) tryTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// retryable reports a deadlock or lock wait timeout.
func retryable(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
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
		return fmt.Errorf("mysql: begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("mysql: commit: %w", err)
	}
	s.Notify()
	return nil
}

// Wakeups implements outbox.Waker: the returned channel receives a value
// soon after messages became claimable through this Store: after
// MessageEnqueue and InTx commit, and after MessageFinish, MessageRecover,
// MessageRequeue and MessageCancel changed something (a finished message
// unblocks the next one of its group). Signals are coalesced: a slow reader
// sees one value for many events. The channel is closed when ctx ends or the
// Store is closed.
//
// The signal is in-process only: processors in other processes find new
// messages at their next poll. Messages enqueued with MessageEnqueueTx in a
// transaction the application commits itself are not signalled, because the
// store cannot see the commit: call Notify after the commit, or use InTx.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} { return s.wake.Subscribe(ctx) }

// Notify wakes every Wakeups listener, e.g. right after the application
// committed a transaction in which it enqueued messages with
// MessageEnqueueTx. It never blocks.
func (s *Store) Notify() { s.wake.Notify() }

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

func notFound(tenant, id string) error {
	return fmt.Errorf("%w: id %q in tenant %q", outbox.ErrNotFound, id, tenant)
}
