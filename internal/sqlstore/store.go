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

// Options are a store's options, as its Options struct has them.
type Options struct {
	TablePrefix   string
	ClaimPerGroup int
	Clock         outbox.Clock
	Logger        *slog.Logger
}

// Config is what a store passes to New.
type Config struct {
	DB *sql.DB
	// TxDB, when set, is the database InTx begins its transactions on
	// (SQLite: a pool whose transactions begin IMMEDIATE); DB otherwise.
	TxDB *sql.DB
	// OwnDB makes Close close DB (and TxDB).
	OwnDB bool
	// Env is the store's defaulted options (from Options.Env).
	Env     Env
	Syntax  Syntax
	Dialect Dialect
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

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_]*$`)

// Env checks o and returns it defaulted, for a database of syntax sx.
func (o Options) Env(sx Syntax) (Env, error) {
	prefix := cmp.Or(o.TablePrefix, DefaultTablePrefix)
	if !validPrefix.MatchString(prefix) || len(prefix) > sx.MaxPrefix {
		return Env{}, outbox.InvalidParam("Options.TablePrefix",
			fmt.Sprintf("may hold only ASCII letters, digits and underscores (at most %d)", sx.MaxPrefix))
	}
	if o.ClaimPerGroup < 0 {
		return Env{}, outbox.InvalidParam("Options.ClaimPerGroup", "must not be negative")
	}
	env := Env{
		Prefix:        prefix,
		ClaimPerGroup: cmp.Or(o.ClaimPerGroup, DefaultClaimPerGroup),
		Clock:         cmp.Or[outbox.Clock](o.Clock, outbox.SystemClock),
		Log:           o.Logger,
	}
	if env.Log == nil {
		env.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return env, nil
}

// Store is the part of a database/sql store that mysql and sqlite share:
// each store holds one and gives every exported method a method of its own
// that calls it (where the store's godoc documents it). Store calls the
// store back only through its Dialect.
type Store struct {
	db      *sql.DB
	syntax  Syntax
	dialect Dialect
	cfg     Config
	wake    *wake.Hub

	clock                                outbox.Clock
	log                                  *slog.Logger
	prefix                               string
	messages, attempts, inbox, versionTb string
	migrations                           []Migration
}

// New checks cfg and returns the shared part of a store.
func New(cfg Config) (*Store, error) {
	if cfg.DB == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if cfg.Dialect == nil || cfg.Env.Clock == nil || cfg.Env.Log == nil {
		return nil, fmt.Errorf("%s: sqlstore.New: no Dialect or Env", cfg.Syntax.Name)
	}
	migs, err := migrations.Load(cfg.MigrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Syntax.Name, err)
	}
	prefix := cfg.Env.Prefix
	return &Store{
		db: cfg.DB, syntax: cfg.Syntax, dialect: cfg.Dialect, cfg: cfg, wake: wake.New(),
		clock: cfg.Env.Clock, log: cfg.Env.Log, prefix: prefix,
		messages: prefix + "messages", attempts: prefix + "attempts",
		inbox: prefix + "inbox", versionTb: prefix + "schema_version",
		migrations: migs,
	}, nil
}

func (s *Store) now(t time.Time) time.Time { return Now(s.clock, t) }

func (s *Store) errorf(op string, err error) error {
	return fmt.Errorf("%s: %s: %w", s.syntax.Name, op, err)
}

// DB is the stores' DB: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) DB() *sql.DB { return s.db }

// Close is the stores' Close: its documentation is on store/mysql.Store
// and store/sqlite.Store.
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

// InTx is the stores' InTx: its documentation is on store/mysql.Store
// and store/sqlite.Store.
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

// Wakeups is the stores' Wakeups: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} { return s.wake.Subscribe(ctx) }

// Notify is the stores' Notify: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) Notify() { s.wake.Notify() }

// MessageEnqueue is the stores' MessageEnqueue: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	var out []outbox.Enqueued
	err = s.dialect.WriteTx(ctx, func(q Querier) error {
		var err error
		out, err = s.dialect.Insert(ctx, q, msgs)
		return err
	})
	if err != nil {
		return nil, s.errorf("enqueue", err)
	}
	s.Notify()
	return out, nil
}

// MessageEnqueueTx is the stores' MessageEnqueueTx: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	out, err := s.dialect.Insert(ctx, tx, msgs)
	if err != nil {
		return nil, s.errorf("enqueue", err)
	}
	return out, nil
}

// prepare returns the messages ready to insert: prepared by outbox.Outbox
// already, or here for a direct caller (p.Prepare), with times at the
// stored precision (the microsecond).
func (s *Store) prepare(p outbox.MessageEnqueueParams) ([]outbox.Message, error) {
	return p.Prepare(s.now(p.Now), time.Microsecond, s.syntax.MaxPayload)
}

// MaxPayloadBytes is the stores' MaxPayloadBytes: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MaxPayloadBytes() int { return s.syntax.MaxPayload }

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

// MessageClaim is the stores' MessageClaim: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, err := s.dialect.Claim(ctx, p, s.now(p.Now))
	if err != nil {
		return nil, s.errorf("claim", err)
	}
	return out, nil
}

// MessageFinish is the stores' MessageFinish: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.FinishResult{}, err
	}
	if len(p.Outcomes) == 0 {
		return outbox.FinishResult{}, nil
	}
	res, applied, err := s.dialect.Finish(ctx, p, s.now(p.Now))
	if err != nil {
		return outbox.FinishResult{}, s.errorf("finish", err)
	}
	if applied > 0 {
		s.Notify() // a finished message may unblock the next one of its group
	}
	return res, nil
}

// InboxClaimTx is the stores' InboxClaimTx: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) InboxClaimTx(ctx context.Context, tx *sql.Tx, p outbox.InboxClaimParams) (bool, error) {
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	if err := p.Validate(); err != nil {
		return false, err
	}
	r, err := tx.ExecContext(ctx, s.syntax.InboxInsert(s.inbox), p.Consumer, p.Tenant, p.MessageID, s.syntax.Time(s.now(p.Now)))
	if err != nil {
		return false, s.errorf("inbox claim", err)
	}
	ok, err := s.syntax.InboxInserted(r)
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
