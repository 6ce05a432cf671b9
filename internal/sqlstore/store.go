package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"regexp"
	"time"

	"github.com/outboxkit/outboxkit/internal/migrations"
	"github.com/outboxkit/outboxkit/internal/wake"
	"github.com/outboxkit/outboxkit/outbox"
)

// Config is what a store passes to New.
type Config struct {
	DB      *sql.DB
	Dialect Dialect
	// TablePrefix, ClaimPerGroup, Clock and Logger are the store's
	// options, defaulted by New.
	TablePrefix   string
	ClaimPerGroup int
	Clock         outbox.Clock
	Logger        *slog.Logger
	// OwnDB makes Close close DB (and TxDB).
	OwnDB bool
	// TxDB, when set, is the database InTx begins its transactions on
	// (SQLite: a pool whose transactions begin IMMEDIATE); DB otherwise.
	TxDB *sql.DB
	// WriteTx runs fn in a store-owned write transaction and commits it.
	WriteTx func(ctx context.Context, fn func(q Querier) error) error
	// MigrateTx runs fn holding the store's migration lock (for MySQL, a
	// named lock on one connection). Defaults to WriteTx.
	MigrateTx func(ctx context.Context, fn func(q Querier) error) error
	// Insert inserts prepared messages with q.
	Insert func(ctx context.Context, q Querier, msgs []outbox.Message) ([]outbox.Enqueued, error)
	// Claim leases messages in a transaction of its own; p is valid and
	// now is the claim's time.
	Claim func(ctx context.Context, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error)
	// Finish records a valid, non-empty batch of outcomes and reports how
	// many it applied.
	Finish func(ctx context.Context, p outbox.MessageFinishParams, now time.Time) (res outbox.FinishResult, applied int, err error)
	// MigrationFS holds the store's migrations, NNN_name.up.sql and
	// NNN_name.down.sql files in the directory "migrations".
	MigrationFS fs.FS
}

// Defaults of the options.
const (
	DefaultTablePrefix   = "outbox_"
	DefaultClaimPerGroup = 10
)

// Env is the store's defaulted options, for the code each store keeps.
type Env struct {
	Prefix        string
	ClaimPerGroup int
	Clock         outbox.Clock
	Log           *slog.Logger
}

// Now returns t, or the store's clock's time when t is zero, in UTC
// truncated to the microsecond.
func (e Env) Now(t time.Time) time.Time { return Now(e.Clock, t) }

// Store is the part of a database/sql store that mysql and sqlite share.
// Its exported methods are the stores' own.
type Store struct {
	env  Env
	db   *sql.DB
	d    Dialect
	cfg  Config
	wake *wake.Hub

	clock                                outbox.Clock
	log                                  *slog.Logger
	prefix                               string
	messages, attempts, inbox, versionTb string
	migrations                           []Migration
}

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_]*$`)

// New checks cfg and returns the shared part of a store and its defaulted
// options.
func New(cfg Config) (*Store, Env, error) {
	s, err := newStore(cfg)
	if err != nil {
		return nil, Env{}, err
	}
	return s, s.env, nil
}

func newStore(cfg Config) (*Store, error) {
	if cfg.DB == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if cfg.MigrateTx == nil {
		cfg.MigrateTx = cfg.WriteTx
	}
	migs, err := migrations.Load(cfg.MigrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Dialect.Name, err)
	}
	prefix := cmp.Or(cfg.TablePrefix, DefaultTablePrefix)
	if !validPrefix.MatchString(prefix) || len(prefix) > cfg.Dialect.MaxPrefix {
		return nil, outbox.InvalidParam("Options.TablePrefix",
			fmt.Sprintf("may hold only ASCII letters, digits and underscores (at most %d)", cfg.Dialect.MaxPrefix))
	}
	if cfg.ClaimPerGroup < 0 {
		return nil, outbox.InvalidParam("Options.ClaimPerGroup", "must not be negative")
	}
	s := &Store{
		env: Env{
			Prefix:        prefix,
			ClaimPerGroup: cmp.Or(cfg.ClaimPerGroup, DefaultClaimPerGroup),
			Clock:         cmp.Or[outbox.Clock](cfg.Clock, outbox.SystemClock),
			Log:           cfg.Logger,
		},
		db: cfg.DB, d: cfg.Dialect, cfg: cfg, wake: wake.New(),
		messages: prefix + "messages", attempts: prefix + "attempts",
		inbox: prefix + "inbox", versionTb: prefix + "schema_version",
		migrations: migs,
	}
	if s.env.Log == nil {
		s.env.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.clock, s.log, s.prefix = s.env.Clock, s.env.Log, prefix
	return s, nil
}

func (s *Store) now(t time.Time) time.Time { return Now(s.clock, t) }

func (s *Store) errorf(op string, err error) error {
	return fmt.Errorf("%s: %s: %w", s.d.Name, op, err)
}

// DB returns the underlying database, for the application's own
// transactions.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes every Wakeups channel and, when the store opened the
// database itself, the database. It is safe to call more than once.
func (s *Store) Close() error {
	if !s.wake.Close() {
		return nil
	}
	if s.cfg.OwnDB {
		if s.cfg.TxDB != nil {
			_ = s.cfg.TxDB.Close()
		}
		return s.db.Close()
	}
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
	db := s.db
	if s.cfg.TxDB != nil {
		db = s.cfg.TxDB
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return s.errorf("begin", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return s.errorf("commit", err)
	}
	s.Notify()
	return nil
}

// Wakeups implements outbox.Waker: the returned channel receives a value
// soon after messages became claimable through this store: after
// MessageEnqueue and InTx commit, and after MessageFinish, MessageRecover,
// MessageRequeue and MessageCancel changed something (a finished message
// unblocks the next one of its group). Signals are coalesced: a slow reader
// sees one value for many events. The channel is closed when ctx ends or the
// store is closed.
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

// MessageEnqueue implements outbox.Enqueuer: it inserts p.Messages in a
// transaction of its own, commits, and wakes the Wakeups listeners. See
// MessageEnqueueTx.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	var out []outbox.Enqueued
	err = s.cfg.WriteTx(ctx, func(q Querier) error {
		var err error
		out, err = s.cfg.Insert(ctx, q, msgs)
		return err
	})
	if err != nil {
		return nil, s.errorf("enqueue", err)
	}
	s.Notify()
	return out, nil
}

// MessageEnqueueTx implements outbox.Enqueuer[*sql.Tx]: it inserts
// p.Messages in the caller's transaction tx, so they exist if and only if
// tx commits. A repeated (Tenant, IdempotencyKey) inserts nothing, raises no
// error and returns the stored message with Existed = true; tx stays
// usable.
//
// The store cannot see when tx commits, so Wakeups is not signalled: use
// InTx, call Notify after the commit, or let the processor's poll pick the
// messages up.
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	out, err := s.cfg.Insert(ctx, tx, msgs)
	if err != nil {
		return nil, s.errorf("enqueue", err)
	}
	return out, nil
}

// prepare returns the messages ready to insert: prepared by outbox.Outbox
// already, or here for a direct caller (p.Prepare), with times at the
// stored precision (the microsecond).
func (s *Store) prepare(p outbox.MessageEnqueueParams) ([]outbox.Message, error) {
	return p.PrepareWithin(s.now(p.Now), time.Microsecond, s.d.MaxPayload)
}

// MaxPayloadBytes implements outbox.PayloadLimiter: the largest payload the
// store holds (see the store's Options documentation).
func (s *Store) MaxPayloadBytes() int { return s.d.MaxPayload }

// PayloadArg is a message's payload as an insert argument: JSON as text
// (so the database's JSON functions read it as today), other content
// types as bytes (a BLOB; never nil, so an empty payload is not NULL).
func PayloadArg(m *outbox.Message) any {
	if m.IsJSON() {
		return string(m.Payload)
	}
	if m.Payload == nil {
		return []byte{}
	}
	return m.Payload
}

// MessageClaim implements outbox.Store: it checks p, then leases up to
// p.Limit due PENDING messages to p.Owner (PROCESSING, Attempts+1,
// ClaimedAt = Now) with the store's claim, keeping FIFO per group, and
// returns them ordered by Seq.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, err := s.cfg.Claim(ctx, p, s.now(p.Now))
	if err != nil {
		return nil, s.errorf("claim", err)
	}
	return out, nil
}

// MessageFinish implements outbox.Store: it checks p, then records the
// batch of outcomes with the store's finish, in one transaction. Every
// outcome is fenced by the lease (status PROCESSING, ClaimedBy = p.Owner,
// Attempts = the outcome's Attempt, claim_token = the outcome's ClaimToken,
// NULL for ""); one whose lease was lost changes nothing and its ID is
// returned in LeaseLost. Sent, retry and dead
// outcomes add a row to the attempt history; a release does not (the
// attempt is not counted). A release with NextAttemptAt is a deferral: the
// message is due again at that time, with LastError set from its Error; a
// plain release keeps its due time and LastError.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.FinishResult{}, err
	}
	if len(p.Outcomes) == 0 {
		return outbox.FinishResult{}, nil
	}
	res, applied, err := s.cfg.Finish(ctx, p, s.now(p.Now))
	if err != nil {
		return outbox.FinishResult{}, s.errorf("finish", err)
	}
	if applied > 0 {
		s.Notify() // a finished message may unblock the next one of its group
	}
	return res, nil
}

// InboxClaimTx implements outbox.InboxStore[*sql.Tx]: it records, in the
// caller's transaction tx, that p.Consumer handles (p.Tenant, p.MessageID)
// and returns true only when tx inserted the record. Invalid params are
// refused before any statement runs, and a repeated message raises no
// error: tx stays usable in both cases. A concurrent transaction claiming
// the same message waits until the first ends: it then returns false when
// the first committed and true when it rolled back.
func (s *Store) InboxClaimTx(ctx context.Context, tx *sql.Tx, p outbox.InboxClaimParams) (bool, error) {
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	if err := p.ValidateOnce(); err != nil {
		return false, err
	}
	r, err := tx.ExecContext(ctx, s.d.InboxInsert(s.inbox), p.Consumer, p.Tenant, p.MessageID, s.d.Time(s.now(p.Now)))
	if err != nil {
		return false, s.errorf("inbox claim", err)
	}
	ok, err := s.d.InboxInserted(r)
	if err != nil {
		return false, s.errorf("inbox claim", err)
	}
	return ok, nil
}

// GroupKey is (tenant, topic, group), ordered as both databases compare
// the binary keys (byte order, as Go compares strings).
type GroupKey struct{ Tenant, Topic, Grp string }

// Less orders keys by tenant, topic, then group.
func (a GroupKey) Less(b GroupKey) bool {
	if a.Tenant != b.Tenant {
		return a.Tenant < b.Tenant
	}
	if a.Topic != b.Topic {
		return a.Topic < b.Topic
	}
	return a.Grp < b.Grp
}

// Original reads back the stored message with m's (Tenant, IdempotencyKey)
// after an insert that inserted nothing (message i of a batch): the
// original, or, when none has the key, an error saying that m's ID is taken.
func Original(ctx context.Context, q Querier, query string, i int, m outbox.Message) (outbox.Enqueued, error) {
	stored, err := ScanMessage(q.QueryRowContext(ctx, query, m.Tenant, m.IdempotencyKey))
	if IsNoRows(err) {
		return outbox.Enqueued{}, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("ID", fmt.Sprintf("%q is already used by another message", m.ID)))
	}
	if err != nil {
		return outbox.Enqueued{}, fmt.Errorf("message %d: read the original: %w", i, err)
	}
	return outbox.Enqueued{Message: stored, Existed: true}, nil
}
