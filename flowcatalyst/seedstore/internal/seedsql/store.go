// Package seedsql is what the SQL stores over seed 004's tables
// (flowcatalyst/seedstore/postgres and mysql) share beyond seedcore: the
// database handle, the tables with the statements whose shape is the same
// on both databases, and the operations that are one such statement per
// table (insert, enqueue, the reads, requeue, prune). What differs is data
// (Dialect), not callbacks; each store's methods call these and add what
// is its own (claim, finish, recover, create).
package seedsql

import (
	"context"
	"database/sql"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// DB is what the stores need of a database handle; *sql.DB has it.
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Execer runs a statement: *sql.Tx, *sql.DB or *sql.Conn.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Statements are a table's statements whose shape is the same on both
// databases (the placeholders differ).
type Statements struct {
	// Insert writes a PENDING row: id, type, message_group, payload,
	// created_at, processed_at.
	Insert string
	// Get reads the row with an id (Columns).
	Get string
	// List lists rows by id after an id, with a status and a group when
	// set, at most a limit (Columns); see Dialect.RepeatListArgs.
	List string
	// Count counts rows by status.
	Count string
	// Requeue moves the FAILED row with an id back to PENDING.
	Requeue string
	// Prune deletes up to a limit of COMPLETED and FAILED rows finished
	// before a time.
	Prune string
}

// Dialect is what differs between the databases in the shared operations.
type Dialect struct {
	// Quote quotes identifiers: `"` or "`".
	Quote string
	// Precision is TIMESTAMP's: a microsecond on PostgreSQL, a second on
	// MySQL.
	Precision time.Duration
	// StrictOrder gives each enqueued message a later created_at than the
	// one before: PostgreSQL orders a group by created_at alone.
	StrictOrder bool
	// RepeatListArgs gives each of List's values twice, as ? placeholders
	// need (MySQL).
	RepeatListArgs bool
}

// Table is one of the two tables.
type Table struct {
	Topic string
	Name  string // quoted, possibly qualified
	Raw   string // as configured
	Statements
}

// Store is the shared part of a SQL store.
type Store struct {
	DB     DB
	Core   *seedcore.Core
	Tables []*Table // events, dispatch jobs
	d      Dialect
}

// New returns the shared part of a store over db with opts: it applies
// the defaults, quotes the table names and builds each table's statements
// with build (from the quoted name).
func New(db DB, opts seedcore.Options, d Dialect, build func(table string) Statements) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	core, err := seedcore.New(&opts)
	if err != nil {
		return nil, err
	}
	s := &Store{DB: db, Core: core, d: d}
	for _, t := range core.Tables() {
		q, err := seedcore.QuoteIdent(t.Name, d.Quote)
		if err != nil {
			return nil, outbox.InvalidParam(t.Field, err.Error())
		}
		s.Tables = append(s.Tables, &Table{Topic: t.Topic, Name: q, Raw: t.Name, Statements: build(q)})
	}
	return s, nil
}

// TableOf returns the table of topic.
func (s *Store) TableOf(topic string) *Table {
	for _, t := range s.Tables {
		if t.Topic == topic {
			return t
		}
	}
	return nil
}
