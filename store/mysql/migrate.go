package mysql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one versioned schema change, as Store.Migrations returns it
// rendered for the store's table prefix.
type Migration = sqlstore.Migration

// migrateLockTimeout is how long Migrate, MigrateTo and MigrateDown wait for
// another replica's migration to finish.
const migrateLockTimeout = 5 * time.Minute

// MigrateTx runs fn on one connection holding a named lock (GET_LOCK)
// scoped to the database and the table prefix, so replicas that migrate at
// the same time run one after the other. MySQL commits DDL statement by
// statement, so a migration is not atomic; every statement of the embedded
// migrations is idempotent (IF NOT EXISTS), so a migration interrupted
// half-way completes on the next call.
func (d *dialect) MigrateTx(ctx context.Context, fn func(q sqlstore.Querier) error) error {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysql: migrate: connection: %w", err)
	}
	defer c.Close()
	var got sql.NullInt64
	if err := c.QueryRowContext(ctx, `SELECT GET_LOCK(CONCAT('outboxkit:', MD5(CONCAT(COALESCE(DATABASE(), ''), '.', ?))), ?)`,
		d.env.Prefix, int(migrateLockTimeout/time.Second)).Scan(&got); err != nil {
		return fmt.Errorf("mysql: migrate: lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("mysql: migrate: another migration held the lock for %v", migrateLockTimeout)
	}
	defer func() {
		_, _ = c.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(CONCAT('outboxkit:', MD5(CONCAT(COALESCE(DATABASE(), ''), '.', ?))))`, d.env.Prefix)
	}()
	return fn(c)
}
