package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Querier is what *sql.DB, *sql.Tx and *sql.Conn offer.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// Dialect is what each store does its own way, called by the shared code:
// its transactions and the three operations whose SQL differs in substance
// between the databases (the insert, the claim and the batch of outcomes).
// The shared code validates and stamps the call first; a Dialect's methods
// receive valid params and the call's time, and use the package's helpers
// (scanning, attempt rows) but never call back into Store.
type Dialect interface {
	// WriteTx runs fn in a store-owned write transaction and commits it
	// when fn returns nil (rolls back otherwise).
	WriteTx(ctx context.Context, fn func(q Querier) error) error
	// MigrateTx runs fn holding the store's migration lock (for MySQL, a
	// named lock on one connection; for SQLite, a write transaction).
	MigrateTx(ctx context.Context, fn func(q Querier) error) error
	// Insert inserts prepared messages with q (the caller's transaction or
	// one of WriteTx's).
	Insert(ctx context.Context, q Querier, msgs []outbox.Message) ([]outbox.Enqueued, error)
	// Claim leases messages in a transaction of its own; p is valid and
	// now is the claim's time.
	Claim(ctx context.Context, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error)
	// Finish records a valid, non-empty batch of outcomes at now and
	// reports how many it applied.
	Finish(ctx context.Context, p outbox.MessageFinishParams, now time.Time) (res outbox.FinishResult, applied int, err error)
}

// Syntax is what differs between the databases at the level of SQL text
// and arguments.
type Syntax struct {
	// Name prefixes errors and logs ("mysql", "sqlite").
	Name string
	// Time converts a (UTC, microsecond) time to a column argument.
	Time func(t time.Time) any
	// Text converts a JSON document to a column argument.
	Text func(b []byte) any
	// ForUpdate ends a SELECT that locks the rows it reads until the
	// transaction ends ("" where the write transaction locks everything).
	ForUpdate string
	// SkipLocked ends a SELECT that locks its rows and skips rows other
	// transactions hold.
	SkipLocked string
	// Earliest renders the earlier of a time column and one time argument.
	Earliest func(col string) string
	// DeleteOldest renders a statement deleting at most LIMIT (second
	// argument) rows of table whose col is before the first argument,
	// oldest first.
	DeleteOldest func(table, col string) string
	// VersionTable renders the DDL creating the schema version table.
	VersionTable func(table string) string
	// TableExists is a query counting the tables named by its argument.
	TableExists string
	// SplitStatements runs a migration file statement by statement (the
	// driver runs one statement per call).
	SplitStatements bool
	// MaxPrefix is the longest table prefix.
	MaxPrefix int
	// MaxPayload is the largest payload the store holds, in bytes (its
	// outbox.PayloadLimiter ceiling).
	MaxPayload int
	// InboxInsert renders, for the inbox table, the statement recording an
	// inbox claim (consumer, tenant, message ID, time) without failing on a
	// repeat; InboxInserted reads from its result whether it inserted.
	InboxInsert   func(table string) string
	InboxInserted func(r sql.Result) (bool, error)
}

// NullTime is d.Time, or NULL for the zero time.
func (d Syntax) NullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return d.Time(t)
}

// NullText is d.Text, or NULL for an empty document.
func (d Syntax) NullText(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return d.Text(b)
}
