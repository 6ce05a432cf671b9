package sqlite

import (
	"context"
	"embed"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
)

// Migrations returns every embedded migration, oldest first, rendered for
// the store's table prefix. Users with their own migration tool can apply
// Up and Down themselves instead of calling Migrate.
func (s *Store) Migrations() []Migration { return s.core.Migrations() }

// Migrate brings the schema up to the newest embedded migration. It is
// idempotent and safe to call from many replicas at once: they serialise on
// the store's migration lock, and the later ones find nothing to do.
func (s *Store) Migrate(ctx context.Context) error { return s.core.Migrate(ctx) }

// MigrateTo moves the schema to version target: up when it is behind, down
// (running the down migrations, newest first) when it is ahead. Version 0
// removes every table of the store, including the schema version table.
func (s *Store) MigrateTo(ctx context.Context, target int) error {
	return s.core.MigrateTo(ctx, target)
}

// MigrateDown reverts every applied migration, newest first, and drops the
// schema version table (MigrateTo 0): the store's tables and their data are
// gone. It is meant for tests and for uninstalling.
func (s *Store) MigrateDown(ctx context.Context) error { return s.core.MigrateDown(ctx) }

// SchemaVersion returns the newest applied migration version, 0 when none.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) { return s.core.SchemaVersion(ctx) }

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
