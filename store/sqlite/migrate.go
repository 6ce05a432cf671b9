package sqlite

import (
	"context"
	"embed"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
)

// migrationFS holds the embedded migrations, NNN_name.up.sql and
// NNN_name.down.sql. Migrate, MigrateTo and MigrateDown run in one BEGIN
// IMMEDIATE transaction, so they are atomic and safe to call from many
// processes at once.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one versioned schema change, as Store.Migrations returns it
// rendered for the store's table prefix.
type Migration = sqlstore.Migration

// MigrateTx runs fn in a write transaction (BEGIN IMMEDIATE): SQLite's one
// write lock serialises the replicas that migrate at once, and the
// migration is atomic.
func (d *dialect) MigrateTx(ctx context.Context, fn func(q sqlstore.Querier) error) error {
	return d.WriteTx(ctx, fn)
}
