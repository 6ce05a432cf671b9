package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/migrations"
)

// Migration is one versioned schema change: its up and down SQL.
type Migration = migrations.Migration

// Migrations is the stores' Migrations: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) Migrations() []Migration {
	out := make([]Migration, len(s.migrations))
	for i, m := range s.migrations {
		m.Up, m.Down = s.render(m.Up), s.render(m.Down)
		out[i] = m
	}
	return out
}

func (s *Store) render(text string) string { return strings.ReplaceAll(text, "{{prefix}}", s.prefix) }

// Migrate is the stores' Migrate: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) Migrate(ctx context.Context) error {
	migs := s.migrations
	if len(migs) == 0 {
		return fmt.Errorf("%s: migrate: no embedded migrations", s.syntax.Name)
	}
	return s.migrate(ctx, migs[len(migs)-1].Version)
}

// MigrateTo is the stores' MigrateTo: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MigrateTo(ctx context.Context, target int) error {
	if target < 0 {
		return fmt.Errorf("%s: migrate: version %d is negative", s.syntax.Name, target)
	}
	return s.migrate(ctx, target)
}

// MigrateDown is the stores' MigrateDown: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MigrateDown(ctx context.Context) error { return s.MigrateTo(ctx, 0) }

func (s *Store) migrate(ctx context.Context, target int) error {
	migs := s.Migrations()
	if n := len(migs); n == 0 || target > migs[n-1].Version {
		return fmt.Errorf("%s: migrate: version %d is newer than this package knows", s.syntax.Name, target)
	}
	return s.dialect.MigrateTx(ctx, func(q Querier) error {
		if _, err := q.ExecContext(ctx, s.syntax.VersionTable(s.versionTb)); err != nil {
			return s.errorf("migrate: create "+s.versionTb, err)
		}
		applied := map[int]bool{}
		err := scanRows(ctx, q, `SELECT version FROM `+s.versionTb, nil, func(rows *sql.Rows) error {
			var v int
			err := rows.Scan(&v)
			applied[v] = true
			return err
		})
		if err != nil {
			return s.errorf("migrate: read "+s.versionTb, err)
		}
		for _, m := range migs {
			if m.Version > target || applied[m.Version] {
				continue
			}
			if err := s.execFile(ctx, q, m.Up); err != nil {
				return s.errorf(fmt.Sprintf("migration %03d_%s up", m.Version, m.Name), err)
			}
			if _, err := q.ExecContext(ctx, `INSERT INTO `+s.versionTb+` (version, name, applied_at) VALUES (?, ?, ?)`,
				m.Version, m.Name, s.syntax.Time(s.now(time.Time{}))); err != nil {
				return s.errorf(fmt.Sprintf("record migration %d", m.Version), err)
			}
			s.log.InfoContext(ctx, "outboxkit/"+s.syntax.Name+": migrated", "version", m.Version, "name", m.Name)
		}
		for i := len(migs) - 1; i >= 0; i-- {
			m := migs[i]
			if m.Version <= target || !applied[m.Version] {
				continue
			}
			if err := s.execFile(ctx, q, m.Down); err != nil {
				return s.errorf(fmt.Sprintf("migration %03d_%s down", m.Version, m.Name), err)
			}
			if _, err := q.ExecContext(ctx, `DELETE FROM `+s.versionTb+` WHERE version = ?`, m.Version); err != nil {
				return s.errorf(fmt.Sprintf("unrecord migration %d", m.Version), err)
			}
			s.log.InfoContext(ctx, "outboxkit/"+s.syntax.Name+": reverted", "version", m.Version, "name", m.Name)
		}
		if target == 0 {
			if _, err := q.ExecContext(ctx, `DROP TABLE IF EXISTS `+s.versionTb); err != nil {
				return s.errorf("drop "+s.versionTb, err)
			}
		}
		return nil
	})
}

// execFile runs one rendered migration file, statement by statement where
// the dialect asks for it.
func (s *Store) execFile(ctx context.Context, q Querier, text string) error {
	stmts := []string{text}
	if s.syntax.SplitStatements {
		stmts = Statements(text)
	}
	for _, stmt := range stmts {
		if _, err := q.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// Statements splits a migration file into statements: they end with ";" at
// the end of a line; "--" comment lines are dropped.
func Statements(text string) []string {
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

// SchemaVersion is the stores' SchemaVersion: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, s.syntax.TableExists, s.versionTb).Scan(&n); err != nil {
		return 0, s.errorf("schema version", err)
	}
	if n == 0 {
		return 0, nil
	}
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+s.versionTb).Scan(&v); err != nil {
		return 0, s.errorf("schema version", err)
	}
	return v, nil
}
