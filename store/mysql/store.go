package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/internal/surface"
	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultTablePrefix is the prefix of the store's tables when
// Options.TablePrefix is empty: outbox_messages, outbox_attempts,
// outbox_groups, outbox_inbox and outbox_schema_version.
const DefaultTablePrefix = "outbox_"

// DefaultClaimPerGroup is the default of Options.ClaimPerGroup. It is 10,
// where store/postgres's is 100: on this store a run of 100 made no drain
// faster, and drains by several processors slower (see the CHANGELOG), while
// a short run spreads a claim over more groups and leaves fewer messages to
// release when a failure blocks a group.
const DefaultClaimPerGroup = 10

// Options configures a Store. The zero value is valid.
type Options struct {
	// TablePrefix prefixes every table and index name. It may hold ASCII
	// letters, digits and underscores (at most 32). Defaults to
	// DefaultTablePrefix.
	TablePrefix string
	// ClaimPerGroup is the most messages of one ordered group a claim takes
	// while other groups have claimable messages too; a claim that finds
	// fewer than its Limit takes more of the groups it cut. Defaults to
	// DefaultClaimPerGroup.
	ClaimPerGroup int
	// Clock stamps the store's writes when a call's Params carry no Now.
	// Defaults to outbox.SystemClock.
	Clock outbox.Clock
	// Logger receives the store's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// The Store's methods that the shared code does are generated into
// methods.go from one template for store/mysql and store/sqlite.
//
//go:generate go run ../../internal/sqlstore/genmethods -pkg mysql

// Store is the MySQL/MariaDB outbox store. It is safe for concurrent use.
// Create it with New and call Migrate before using it.
type Store struct {
	// core is the database/sql code this store shares with store/sqlite;
	// the methods that call it say what it does for this store.
	core *sqlstore.Store
	d    *dialect
}

// dialect is this store's own code, which the shared code calls through
// sqlstore.Dialect: its transactions, migration lock, insert, claim and
// batch of outcomes.
type dialect struct {
	db  *sql.DB
	env sqlstore.Env
	q   queries
}

// Store has the method set of every store (the ports, InTx, MessageListTx
// and the migration API), and DB, Close and Notify; its dialect is the
// shared code's.
var (
	_ surface.Store[*sql.Tx] = (*Store)(nil)
	_ surface.SQL            = (*Store)(nil)
	_ outbox.Admin           = (*Store)(nil)
	_ sqlstore.Dialect       = (*dialect)(nil)
)

// syntax is how MySQL's SQL text differs from SQLite's in the shared code.
var syntax = sqlstore.Syntax{
	Name:       "mysql",
	Time:       func(t time.Time) any { return ts(t) },
	Text:       func(b []byte) any { return b },
	ForUpdate:  " FOR UPDATE",
	SkipLocked: " FOR UPDATE SKIP LOCKED",
	Earliest: func(col string) string {
		return "LEAST(" + col + ", CAST(? AS DATETIME(6)))"
	},
	DeleteOldest: func(table, col string) string {
		return `DELETE FROM ` + table + ` WHERE ` + col + ` < ? ORDER BY ` + col + ` LIMIT ?`
	},
	VersionTable: func(table string) string {
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (
			version    INT          NOT NULL PRIMARY KEY,
			name       VARCHAR(255) NOT NULL,
			applied_at DATETIME(6)  NOT NULL) ENGINE = InnoDB`
	},
	TableExists:     `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`,
	SplitStatements: true,
	MaxPrefix:       32,
	// payload is a MEDIUMBLOB (16 MiB - 1); 64 KiB stay for the rest of
	// the row and the statement within a 16 MiB max_allowed_packet
	// (MariaDB's default; MySQL 8's is 64 MiB).
	MaxPayload:    16<<20 - 64<<10,
	InboxInsert:   inboxInsert,
	InboxInserted: inboxInserted,
}

// New returns a Store over db, a database opened with the
// github.com/go-sql-driver/mysql driver ("mysql"). The caller keeps
// ownership of db: Close does not close it. The DSN needs no particular
// parameters: parseTime and loc may be set or not (the store reads and
// writes its DATETIME columns as UTC either way), and so may
// clientFoundRows. New does not touch the database; call Migrate.
func New(db *sql.DB, opts Options) (*Store, error) {
	env, err := sqlstore.Options{
		TablePrefix: cmp.Or(opts.TablePrefix, DefaultTablePrefix), ClaimPerGroup: cmp.Or(opts.ClaimPerGroup, DefaultClaimPerGroup),
		Clock: opts.Clock, Logger: opts.Logger,
	}.Env(syntax)
	if err != nil {
		return nil, err
	}
	d := &dialect{db: db, env: env, q: newQueries(env.Prefix)}
	core, err := sqlstore.New(sqlstore.Config{
		DB: db, Env: env, Syntax: syntax, Dialect: d, MigrationFS: migrationFS,
	})
	if err != nil {
		return nil, err
	}
	return &Store{core: core, d: d}, nil
}

// txRetries is how many times a store-owned transaction is retried after
// the server chose it as a deadlock victim (or its lock wait timed out).
const txRetries = 5

// WriteTx runs fn in a store-owned READ COMMITTED transaction and commits it.
// A transaction the server rolled back because of a deadlock (error 1213)
// or a lock wait timeout (1205) is run again, up to txRetries times.
func (d *dialect) WriteTx(ctx context.Context, fn func(q sqlstore.Querier) error) error {
	var err error
	for try := 0; ; try++ {
		err = d.tryTx(ctx, fn)
		if err == nil || !retryable(err) || try >= txRetries || ctx.Err() != nil {
			return err
		}
		d.env.Log.DebugContext(ctx, "outboxkit/mysql: retrying a transaction", "err", err, "try", try+1)
		time.Sleep(time.Duration(try+1) * 5 * time.Millisecond)
	}
}

func (d *dialect) tryTx(ctx context.Context, fn func(q sqlstore.Querier) error) error {
	tx, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// retryable reports a deadlock or lock wait timeout.
func retryable(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// dbTimeLayout is how times are sent to the server: DATETIME(6) literals in
// UTC. Sending strings (not time.Time) keeps the stored value independent of
// the DSN's loc parameter.
const dbTimeLayout = "2006-01-02 15:04:05.000000"

// ts converts t to a DATETIME(6) argument in UTC.
func ts(t time.Time) string { return t.UTC().Format(dbTimeLayout) }

// queries holds the table names and the fixed SQL, rendered once for a
// prefix.
type queries struct {
	messages, attempts, groups, pauses string

	insert, selectByKey string
}

// lockGroups returns the statement that locks n group rows (creating
// them), in the order of its VALUES list.
func (q queries) lockGroups(n int) string {
	return `INSERT INTO ` + q.groups + ` (tenant, topic, grp) VALUES ` + rowMarks(n, "(?, ?, ?)") + `
		ON DUPLICATE KEY UPDATE grp = grp`
}

// insertRows returns q.insert for n rows.
func (q queries) insertRows(n int) string {
	if n == 1 {
		return q.insert
	}
	return strings.Replace(q.insert, insertRow, rowMarks(n, insertRow), 1)
}

// insertRow is the VALUES row of q.insert.
const insertRow = `(?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, ?, ?, ?, ?)`

// rowMarks returns n copies of row, comma-separated.
func rowMarks(n int, row string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	return b.String()
}

func newQueries(prefix string) queries {
	m := prefix + "messages"
	q := queries{messages: m, attempts: prefix + "attempts", groups: prefix + "groups", pauses: prefix + "pauses"}
	// "id = id" changes nothing: a duplicate (tenant, idempotency_key) or id
	// inserts nothing, reports 0 affected rows and raises no error, so the
	// caller's transaction goes on.
	q.insert = `INSERT INTO ` + m + ` (id, tenant, topic, grp, idempotency_key, payload, content_type, headers, status,
		attempts, max_attempts, next_attempt_at, created_at, updated_at)
		VALUES ` + insertRow + `
		ON DUPLICATE KEY UPDATE id = id`
	// A locking read sees the newest committed row whatever the caller's
	// isolation level (a REPEATABLE READ snapshot may predate it).
	q.selectByKey = `SELECT ` + sqlstore.MessageCols + ` FROM ` + m + ` WHERE tenant = ? AND idempotency_key = ? LOCK IN SHARE MODE`
	return q
}
