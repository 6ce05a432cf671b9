package sqlite

import (
	"context"
	"embed"
	"fmt"
	"github.com/outboxkit/outboxkit/internal/migrations"
	"strings"
	"time"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one schema version: its up and down SQL.
type migration = migrations.Migration

// loadMigrations reads the embedded migrations, ordered by version. Files
// are named NNN_name.up.sql and NNN_name.down.sql.
func loadMigrations() ([]migration, error) {
	m, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return m, nil
}

func (s *Store) render(sqlText string) string {
	return strings.ReplaceAll(sqlText, "{{prefix}}", s.prefix)
}

func (s *Store) versionTable() string { return s.prefix + "schema_version" }

// appliedVersions returns the versions recorded in the schema_version table.
func (s *Store) appliedVersions(ctx context.Context, q querier) (map[int]bool, error) {
	if _, err := q.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.versionTable()+` (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL)`); err != nil {
		return nil, fmt.Errorf("sqlite: create %s: %w", s.versionTable(), err)
	}
	rows, err := q.QueryContext(ctx, `SELECT version FROM `+s.versionTable())
	if err != nil {
		return nil, fmt.Errorf("sqlite: read %s: %w", s.versionTable(), err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		applied[v] = true
	}
	return applied, rows.Err()
}

// Migrate brings the schema up to the newest embedded migration. It runs in
// one BEGIN IMMEDIATE transaction, so it is idempotent and safe to call from
// many processes at once: the first applies what is missing, the others find
// nothing to do.
func (s *Store) Migrate(ctx context.Context) error {
	migs, err := loadMigrations()
	if err != nil {
		return err
	}
	return s.writeTx(ctx, func(q querier) error {
		applied, err := s.appliedVersions(ctx, q)
		if err != nil {
			return err
		}
		for _, m := range migs {
			if applied[m.Version] {
				continue
			}
			if _, err := q.ExecContext(ctx, s.render(m.Up)); err != nil {
				return fmt.Errorf("sqlite: migration %03d_%s up: %w", m.Version, m.Name, err)
			}
			if _, err := q.ExecContext(ctx, `INSERT INTO `+s.versionTable()+` (version, name, applied_at) VALUES (?, ?, ?)`,
				m.Version, m.Name, time.Now().UnixMicro()); err != nil {
				return fmt.Errorf("sqlite: record migration %d: %w", m.Version, err)
			}
			s.log.Info("sqlite: migrated", "version", m.Version, "name", m.Name)
		}
		return nil
	})
}

// MigrateDown reverts every applied migration, newest first, and drops the
// schema_version table: the store's tables and their data are gone. It is
// meant for tests and for uninstalling.
func (s *Store) MigrateDown(ctx context.Context) error {
	migs, err := loadMigrations()
	if err != nil {
		return err
	}
	return s.writeTx(ctx, func(q querier) error {
		applied, err := s.appliedVersions(ctx, q)
		if err != nil {
			return err
		}
		for i := len(migs) - 1; i >= 0; i-- {
			m := migs[i]
			if !applied[m.Version] {
				continue
			}
			if _, err := q.ExecContext(ctx, s.render(m.Down)); err != nil {
				return fmt.Errorf("sqlite: migration %03d_%s down: %w", m.Version, m.Name, err)
			}
			s.log.Info("sqlite: reverted", "version", m.Version, "name", m.Name)
		}
		if _, err := q.ExecContext(ctx, `DROP TABLE `+s.versionTable()); err != nil {
			return fmt.Errorf("sqlite: drop %s: %w", s.versionTable(), err)
		}
		return nil
	})
}

// SchemaVersion returns the newest applied migration version, 0 when none.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+s.versionTable()).Scan(&v)
	if err != nil {
		if strings.Contains(err.Error(), "no such table") {
			return 0, nil
		}
		return 0, fmt.Errorf("sqlite: schema version: %w", err)
	}
	return v, nil
}
