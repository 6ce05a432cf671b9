package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedsql"
	"github.com/outboxkit/outboxkit/outbox"
)

// DB is what the Store needs of a database handle; *sql.DB has it. It must
// be opened with github.com/go-sql-driver/mysql; see New.
type DB = seedsql.DB

// Default table names, as in seed 004.
const (
	DefaultEventsTable       = "outbox_events"
	DefaultDispatchJobsTable = "outbox_dispatch_jobs"
)

// DefaultNullGroup is the group of rows whose message_group is NULL, as in
// the seed.
const DefaultNullGroup = "default"

// Seed statuses.
const (
	StatusPending    = "PENDING"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Options configures a Store.
type Options struct {
	// EventsTable is the table of EVENT items, optionally qualified by its
	// database ("app.outbox_events"). Defaults to "outbox_events".
	EventsTable string
	// DispatchJobsTable is the table of DISPATCH_JOB items. Defaults to
	// "outbox_dispatch_jobs".
	DispatchJobsTable string
	// Logger defaults to discarding.
	Logger *slog.Logger

	// UnorderedNullGroup sends rows whose message_group is NULL without
	// FIFO, in parallel. By default they form one FIFO group, reported as
	// Group "default", as in the seed (messageGroup ?? "default").
	UnorderedNullGroup bool
	// RecoveryCountsAttempt makes recovery of a stuck PROCESSING row count
	// the lost attempt in retry_count, and mark the row FAILED when that
	// was its last one (a row that crashes its processor then stops being
	// retried). By default recovery leaves retry_count alone, as in the
	// seed: "no lost messages, just delayed".
	RecoveryCountsAttempt bool
	// MaxClaimPerGroup is the most rows of one group claimed at once;
	// 0 (the default) means up to the claim's limit. A group is not claimed
	// again while rows of it are in flight, so a small value bounds the
	// group's rate to MaxClaimPerGroup rows per poll.
	MaxClaimPerGroup int
}

// Store is an outbox.Store over seed 004's tables in MySQL or MariaDB. It
// is safe for concurrent use.
type Store struct {
	shared *seedsql.Store // the handle, the tables, what both SQL stores do alike
	core   *seedcore.Core // shared.Core
	tables []*table       // events, dispatch jobs
}

// table is one of the two tables: its name and shared statements, and this
// store's own statements.
type table struct {
	*seedsql.Table
	sql statements
}

// dialect is how the shared statements differ on this database.
var dialect = seedsql.Dialect{Quote: "`", Precision: time.Second, RepeatListArgs: true}

// New returns a Store over db, a MySQL 8 or MariaDB 10.6+ database holding
// seed 004's tables (the seed's DDL; see CreateTables). It does not touch
// the database.
//
// db must be opened with github.com/go-sql-driver/mysql with parseTime=true,
// loc=UTC and the session time zone '+00:00', so that the seed's TIMESTAMP
// columns read and compare in UTC; DSN adds these to a DSN.
func New(db DB, opts Options) (*Store, error) {
	shared, err := seedsql.New(db, seedcore.Options(opts), dialect, sharedStatements)
	if err != nil {
		return nil, err
	}
	s := &Store{shared: shared, core: shared.Core}
	for _, t := range shared.Tables {
		s.tables = append(s.tables, &table{Table: t, sql: buildStatements(t.Name)})
	}
	return s, nil
}

// DSN returns dsn (a github.com/go-sql-driver/mysql DSN such as
// "user:pass@tcp(host:3306)/app") with what New needs: parseTime=true,
// loc=UTC and time_zone '+00:00'. The error does not repeat the DSN.
func DSN(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("seedstore: not a MySQL DSN (user:pass@tcp(host:3306)/db): %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	return cfg.FormatDSN(), nil
}

// CheckTableName returns an error matching outbox.ErrInvalidInput when name
// is not a table name the Store accepts: letters, digits and _, optionally
// qualified by its database (db.table).
func CheckTableName(name string) error { return seedcore.CheckTableName(name) }

// Topics returns the topics of the two tables.
func (s *Store) Topics() []string { return s.core.Topics() }

// tableOf returns the table of topic.
func (s *Store) tableOf(topic string) *table {
	for _, t := range s.tables {
		if t.Topic == topic {
			return t
		}
	}
	return nil
}

// Wakeups implements outbox.Waker; on MySQL the channel never receives
// (claims run to completion). It is closed when ctx ends.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} { return s.core.Wakeups(ctx.Done()) }

var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.Enqueuer[*sql.Tx] = (*Store)(nil)
	_ outbox.Waker             = (*Store)(nil)
	_ outbox.Pinger            = (*Store)(nil)
)
