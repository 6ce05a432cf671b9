package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one versioned schema change, rendered for the store's schema
// and table prefix. Users with their own migration tool can apply Up and
// Down themselves instead of calling Migrate.
type Migration = migrations.Migration

// Migrations returns every migration of this version of the package, oldest
// first, rendered for the store's schema and table prefix.
func (s *Store) Migrations() []Migration {
	migs, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return nil // embedded at build time and checked by the tests; Migrate then fails
	}
	render := strings.NewReplacer("{{schema}}", s.schema, "{{prefix}}", s.prefix)
	for i := range migs {
		migs[i].Up, migs[i].Down = render.Replace(migs[i].Up), render.Replace(migs[i].Down)
	}
	return migs
}

// Migrate brings the schema up to the latest version: it creates the schema
// if needed and applies the missing migrations in one transaction. It is
// idempotent and safe when several replicas call it at once: they serialise
// on an advisory lock and the later ones find nothing to do. When it applied
// a migration it then analyses the tables (ANALYZE, best effort).
func (s *Store) Migrate(ctx context.Context) error {
	migs := s.Migrations()
	if len(migs) == 0 {
		return errors.New("postgres: migrate: no embedded migrations")
	}
	if err := s.migrate(ctx, migs[len(migs)-1].Version); err != nil {
		return err
	}
	// Record Options.AppendOnly, or refuse a store that disagrees with
	// the record.
	if err := s.checkStorage(ctx, true); err != nil {
		return err
	}
	if s.opts.AppendOnly {
		return s.adjustIndexes(ctx)
	}
	return nil
}

// defaultPathIndexes are the messages table's indexes that only the
// default path's statements read. Append-only storage drops them (each
// costs every enqueued row an index insertion) and builds
// appendOnlyIndexes; migrating down to version 13, which leaves it, does
// the reverse (014's down).
var defaultPathIndexes = []string{"messages_claim_ordered", "messages_claim_unordered", "messages_tenant_seq_unleased"}

// appendOnlyIndexes are the messages table's indexes only append-only
// storage reads, by name: the backstop's and the pending topics' scans of
// unordered messages, whose rows stay PENDING when their marks finish
// them (without it, those scans read every message since their start).
var appendOnlyIndexes = [][2]string{
	{"messages_unordered_seq", "(seq) WHERE grp = '' AND status = 'PENDING' AND claimed_by IS NULL"},
}

// adjustIndexes gives the messages table append-only storage's indexes,
// concurrently (enqueues go on meanwhile), and its fillfactor. A concurrent build that failed
// leaves an invalid index, dropped and built again by the next Migrate.
func (s *Store) adjustIndexes(ctx context.Context) error {
	state := func(ix string) (exists, valid bool, err error) {
		err = s.db.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_and(i.indisvalid), false) FROM pg_index i
			WHERE i.indexrelid = to_regclass($1)`, s.schema+"."+s.prefix+ix).Scan(&exists, &valid)
		return exists, valid, err
	}
	for _, ix := range appendOnlyIndexes {
		exists, valid, err := state(ix[0])
		if err != nil {
			return wrapErr("migrate: append-only indexes", err)
		}
		if exists && !valid {
			if _, err := s.db.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+s.schema+"."+s.prefix+ix[0]); err != nil {
				return wrapErr("migrate: append-only indexes", err)
			}
		}
		if !valid {
			if _, err := s.db.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+s.prefix+ix[0]+` ON `+s.messages+` `+ix[1]); err != nil {
				return wrapErr("migrate: append-only indexes", err)
			}
		}
	}
	// Rows are written once: the room the default path's fillfactor (85)
	// leaves on each page for updates stays empty.
	// Set only when not set: the change makes every session plan its
	// statements on the table again.
	var filled bool
	if err := s.db.QueryRow(ctx, `SELECT 'fillfactor=100' = ANY(coalesce(reloptions, '{}')) FROM pg_class WHERE oid = to_regclass($1)`,
		s.messages).Scan(&filled); err != nil {
		return wrapErr("migrate: append-only storage", err)
	}
	if !filled {
		if _, err := s.db.Exec(ctx, `ALTER TABLE `+s.messages+` SET (fillfactor = 100)`); err != nil {
			return wrapErr("migrate: append-only storage", err)
		}
	}
	for _, ix := range defaultPathIndexes {
		exists, _, err := state(ix)
		if err != nil {
			return wrapErr("migrate: append-only indexes", err)
		}
		if !exists {
			continue
		}
		if _, err := s.db.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+s.schema+"."+s.prefix+ix); err != nil {
			return wrapErr("migrate: append-only indexes", err)
		}
	}
	return nil
}

// MigrateTo moves the schema to version target: up when it is behind, down
// (running the Down scripts, newest first) when it is ahead. Version 0
// removes every table, including the migrations table; the schema itself is
// left in place.
func (s *Store) MigrateTo(ctx context.Context, target int) error {
	if target < 0 {
		return fmt.Errorf("postgres: migrate: version %d is negative", target)
	}
	return s.migrate(ctx, target)
}

// MigrateDown removes the whole schema of the store (MigrateTo 0).
func (s *Store) MigrateDown(ctx context.Context) error { return s.MigrateTo(ctx, 0) }

// SchemaVersion returns the latest applied migration, 0 when none.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.migrations).Scan(&exists); err != nil {
		return 0, wrapErr("schema version", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := s.db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+s.migrations).Scan(&v); err != nil {
		return 0, wrapErr("schema version", err)
	}
	return v, nil
}

func (s *Store) migrate(ctx context.Context, target int) error {
	s.logReg.forget() // a migration down past 13 drops the registry
	migs := s.Migrations()
	if len(migs) == 0 {
		return errors.New("postgres: migrate: no embedded migrations")
	}
	if target > migs[len(migs)-1].Version {
		return fmt.Errorf("postgres: migrate: version %d is newer than this package knows (%d)", target, migs[len(migs)-1].Version)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return wrapErr("migrate: begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, s.adminNS, lockMigrate); err != nil {
		return wrapErr("migrate: lock", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.schema); err != nil {
		return wrapErr("migrate: create schema", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.migrations+` (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return wrapErr("migrate: migrations table", err)
	}
	applied := map[int]bool{}
	rows, err := tx.Query(ctx, `SELECT version FROM `+s.migrations)
	if err != nil {
		return wrapErr("migrate: read versions", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return wrapErr("migrate: read versions", err)
	}
	for _, v := range vs {
		applied[v] = true
	}
	upgraded := false
	for _, m := range migs { // up
		if m.Version > target || applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.Up); err != nil {
			return wrapErr(fmt.Sprintf("migrate: up %03d_%s", m.Version, m.Name), err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.migrations+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return wrapErr("migrate: record version", err)
		}
		upgraded = true
	}
	for i := len(migs) - 1; i >= 0; i-- { // down
		m := migs[i]
		if m.Version <= target || !applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.Down); err != nil {
			return wrapErr(fmt.Sprintf("migrate: down %03d_%s", m.Version, m.Name), err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+s.migrations+` WHERE version = $1`, m.Version); err != nil {
			return wrapErr("migrate: record version", err)
		}
	}
	if target == 0 {
		if _, err := tx.Exec(ctx, `DROP TABLE `+s.migrations); err != nil {
			return wrapErr("migrate: drop migrations table", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return wrapErr("migrate: commit", err)
	}
	if upgraded && target >= 1 {
		s.analyze(ctx)
	}
	return nil
}

// analyzeAfterPrune is how many pruned rows make the store analyse its
// tables (see MessagePrune).
const analyzeAfterPrune = 50000

// analyze gathers the tables' statistics (ANALYZE), best effort: it gives up
// after waiting 1 s for a lock (a running VACUUM or ANALYZE) and only logs a
// failure. The hot-path statements do not depend on statistics for their
// plan shape (see planSettings); the other queries and estimates do.
func (s *Store) analyze(ctx context.Context) {
	tx, err := s.db.Begin(ctx)
	if err == nil {
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`)
		if err == nil {
			_, err = tx.Exec(ctx, `ANALYZE `+s.messages+`, `+s.attempts)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
	}
	if err != nil {
		s.log.WarnContext(ctx, "outboxkit/postgres: analyze failed", "err", err)
	}
}
