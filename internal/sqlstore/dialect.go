package sqlstore

import (
	"context"
	"database/sql"
	"time"
)

// Querier is what *sql.DB, *sql.Tx and *sql.Conn offer.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// Dialect is what differs between the databases at the level of SQL text
// and arguments.
type Dialect struct {
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
func (d Dialect) NullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return d.Time(t)
}

// NullText is d.Text, or NULL for an empty document.
func (d Dialect) NullText(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return d.Text(b)
}
