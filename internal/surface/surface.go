// Package surface is the one method set every store offers, checked at
// compile time by each store (var _ surface.Store[TTx] = (*Store)(nil)), so
// a reader who knows one store knows them all.
package surface

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/internal/migrations"
	"github.com/outboxkit/outboxkit/outbox"
)

// Store is what every store implements for its transaction type TTx: the
// ports, its own transaction helper, listing in the caller's transaction,
// and the migration API.
type Store[TTx any] interface {
	outbox.Store
	outbox.Enqueuer[TTx]
	outbox.InboxStore[TTx]
	outbox.Waker
	outbox.DeadLetterBlocker
	// PayloadLimiter: MaxPayloadBytes is the largest payload the store
	// holds, checked against outbox.Options.MaxPayloadBytes.
	outbox.PayloadLimiter
	outbox.LeaseExtender

	// InTx runs fn in a new transaction, commits it when fn returns nil,
	// and wakes the store's processors.
	InTx(ctx context.Context, fn func(tx TTx) error) error
	// MessageListTx is MessageList in the caller's transaction.
	MessageListTx(ctx context.Context, tx TTx, p outbox.MessageListParams) (outbox.MessagePage, error)
	// Migrate applies every embedded migration not yet applied.
	Migrate(ctx context.Context) error
	// MigrateTo moves the schema up or down to a version (0: nothing).
	MigrateTo(ctx context.Context, version int) error
	// MigrateDown removes the store's tables or collections (MigrateTo 0).
	MigrateDown(ctx context.Context) error
	// Migrations returns the migrations rendered for the store: SQL, or
	// mongosh commands for MongoDB.
	Migrations() []migrations.Migration
	// SchemaVersion returns the newest applied migration, 0 when none.
	SchemaVersion(ctx context.Context) (int, error)
}

// SQL is what the database/sql stores (mysql, sqlite) offer besides Store.
type SQL interface {
	// DB returns the store's database.
	DB() *sql.DB
	// Close closes the Wakeups channels (and the database the store
	// opened).
	Close() error
	// Notify wakes the Wakeups listeners in this process.
	Notify()
}
