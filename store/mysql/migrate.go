package mysql

import (
	"context"
	"database/sql"
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
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return m, nil
}

// statements renders a migration file for the store's prefix and splits it
// into statements (the driver runs one statement per call): they end with
// ";" at the end of a line; "--" comment lines are dropped.
func (s *Store) statements(text string) []string {
	text = strings.ReplaceAll(text, "{{prefix}}", s.prefix)
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, strings.TrimSpace(cur.String()))
	}
	return out
}

func (s *Store) versionTable() string { return s.prefix + "schema_version" }

// migrateLockTimeout is how long Migrate and MigrateDown wait for another
// replica's migration to finish.
const migrateLockTimeout = 5 * time.Minute

// withMigrateLock runs fn on one connection holding a named lock (GET_LOCK)
// scoped to the database and the table prefix, so replicas that migrate at
// the same time run one after the other.
func (s *Store) withMigrateLock(ctx context.Context, fn func(c *sql.Conn) error) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysql: migrate: connection: %w", err)
	}
	defer c.Close()
	var got sql.NullInt64
	if err := c.QueryRowContext(ctx, `SELECT GET_LOCK(CONCAT('outboxkit:', MD5(CONCAT(COALESCE(DATABASE(), ''), '.', ?))), ?)`,
		s.prefix, int(migrateLockTimeout/time.Second)).Scan(&got); err != nil {
		return fmt.Errorf("mysql: migrate: lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("mysql: migrate: another migration held the lock for %v", migrateLockTimeout)
	}
	defer func() {
		_, _ = c.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(CONCAT('outboxkit:', MD5(CONCAT(COALESCE(DATABASE(), ''), '.', ?))))`, s.prefix)
	}()
	return fn(c)
}

// appliedVersions creates the schema_version table if needed and returns
// the versions it records.
func (s *Store) appliedVersions(ctx context.Context, c *sql.Conn) (map[int]bool, error) {
	if _, err := c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.versionTable()+` (
		version    INT          NOT NULL PRIMARY KEY,
		name       VARCHAR(255) NOT NULL,
		applied_at DATETIME(6)  NOT NULL) ENGINE = InnoDB`); err != nil {
		return nil, fmt.Errorf("mysql: create %s: %w", s.versionTable(), err)
	}
	rows, err := c.QueryContext(ctx, `SELECT version FROM `+s.versionTable())
	if err != nil {
		return nil, fmt.Errorf("mysql: read %s: %w", s.versionTable(), err)
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

// Migrate brings the schema up to the newest embedded migration. It is
// idempotent and safe to call from many replicas at once: it holds a named
// lock (GET_LOCK, per database and table prefix) while it runs, so the first
// caller applies what is missing and the others then find nothing to do.
// MySQL commits DDL statement by statement, so a migration is not atomic;
// every statement of the embedded migrations is idempotent (IF NOT EXISTS),
// so a migration interrupted half-way completes on the next call.
func (s *Store) Migrate(ctx context.Context) error {
	migs, err := loadMigrations()
	if err != nil {
		return err
	}
	return s.withMigrateLock(ctx, func(c *sql.Conn) error {
		applied, err := s.appliedVersions(ctx, c)
		if err != nil {
			return err
		}
		for _, m := range migs {
			if applied[m.Version] {
				continue
			}
			for _, stmt := range s.statements(m.Up) {
				if _, err := c.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("mysql: migration %03d_%s up: %w", m.Version, m.Name, err)
				}
			}
			if _, err := c.ExecContext(ctx, `INSERT INTO `+s.versionTable()+` (version, name, applied_at) VALUES (?, ?, ?)`,
				m.Version, m.Name, ts(time.Now())); err != nil {
				return fmt.Errorf("mysql: record migration %d: %w", m.Version, err)
			}
			s.log.InfoContext(ctx, "outboxkit/mysql: migrated", "version", m.Version, "name", m.Name)
		}
		return nil
	})
}

// MigrateDown reverts every applied migration, newest first, and drops the
// schema_version table: the store's tables and their data are gone. It is
// meant for tests and for uninstalling. It holds the same lock as Migrate.
func (s *Store) MigrateDown(ctx context.Context) error {
	migs, err := loadMigrations()
	if err != nil {
		return err
	}
	return s.withMigrateLock(ctx, func(c *sql.Conn) error {
		applied, err := s.appliedVersions(ctx, c)
		if err != nil {
			return err
		}
		for i := len(migs) - 1; i >= 0; i-- {
			m := migs[i]
			if !applied[m.Version] {
				continue
			}
			for _, stmt := range s.statements(m.Down) {
				if _, err := c.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("mysql: migration %03d_%s down: %w", m.Version, m.Name, err)
				}
			}
			if _, err := c.ExecContext(ctx, `DELETE FROM `+s.versionTable()+` WHERE version = ?`, m.Version); err != nil {
				return fmt.Errorf("mysql: unrecord migration %d: %w", m.Version, err)
			}
			s.log.InfoContext(ctx, "outboxkit/mysql: reverted", "version", m.Version, "name", m.Name)
		}
		if _, err := c.ExecContext(ctx, `DROP TABLE IF EXISTS `+s.versionTable()); err != nil {
			return fmt.Errorf("mysql: drop %s: %w", s.versionTable(), err)
		}
		return nil
	})
}

// SchemaVersion returns the newest applied migration version, 0 when none.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name = ?`, s.versionTable()).Scan(&n); err != nil {
		return 0, fmt.Errorf("mysql: schema version: %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+s.versionTable()).Scan(&v); err != nil {
		return 0, fmt.Errorf("mysql: schema version: %w", err)
	}
	return v, nil
}

// Migrations returns the number of the newest embedded migration.
func Migrations() int {
	migs, err := loadMigrations()
	if err != nil || len(migs) == 0 {
		return 0
	}
	return migs[len(migs)-1].Version
}
