package seedstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// seedDDL is seed 004's schema, verbatim but for the schema prefix.
const seedDDL = `
CREATE TABLE %[1]s.outbox_events (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
);
CREATE INDEX idx_outbox_events_status
    ON %[1]s.outbox_events(status, message_group, created_at);
CREATE TABLE %[1]s.outbox_dispatch_jobs (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
);
CREATE INDEX idx_outbox_dispatch_jobs_status
    ON %[1]s.outbox_dispatch_jobs(status, message_group, created_at);
`

type bundle struct {
	db     *sql.DB
	schema string
	store  *seedstore.Store
	opts   seedstore.Options
	mysql  bool   // MySQL/MariaDB: statements are rewritten by q
	dsn    string // MySQL/MariaDB: the DSN db was opened with
}

var (
	dollarRE   = regexp.MustCompile(`\$([0-9]+)`)
	intervalRE = regexp.MustCompile(`interval '([0-9]+) (second|minute|hour)s?'`)
)

// q returns query and args for b's database: on MySQL every $N becomes ?
// with args reordered (and repeated) to match.
func (b *bundle) q(query string, args []any) (string, []any) {
	if !b.mysql || !dollarRE.MatchString(query) && !strings.Contains(query, "now() AT") {
		return query, args
	}
	query = strings.ReplaceAll(query, "now() AT TIME ZONE 'UTC'", "NOW()")
	query = intervalRE.ReplaceAllStringFunc(query, func(m string) string {
		p := intervalRE.FindStringSubmatch(m)
		return "INTERVAL " + p[1] + " " + strings.ToUpper(p[2])
	})
	var out []any
	query = dollarRE.ReplaceAllStringFunc(query, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		out = append(out, args[n-1])
		return "?"
	})
	return query, out
}

// setup connects to PostgreSQL, creates a fresh schema holding the seed's
// tables (by plain SQL, as an application would) and returns a Store over
// them. The schema is dropped when the test ends.
func setup(t testing.TB) *bundle {
	t.Helper()
	dsn, why := testbackend.Lookup("OUTBOXKIT_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "127.0.0.1:5432")
	if dsn == "" {
		testbackend.Unavailable(t, "PostgreSQL", why)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		testbackend.Unavailable(t, "PostgreSQL", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		testbackend.Unavailable(t, "PostgreSQL", err.Error())
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "seedstore_" + hex.EncodeToString(b[:])
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		_ = db.Close()
	})
	if _, err := db.ExecContext(ctx, fmt.Sprintf(seedDDL, schema)); err != nil {
		t.Fatalf("create tables: %v", err)
	}
	opts := seedstore.Options{EventsTable: schema + ".outbox_events", DispatchJobsTable: schema + ".outbox_dispatch_jobs"}
	st, err := seedstore.New(db, opts)
	if err != nil {
		t.Fatalf("seedstore.New: %v", err)
	}
	return &bundle{db: db, schema: schema, store: st, opts: opts}
}

// newStore returns another Store over the same tables (another processor).
func (b *bundle) newStore(t *testing.T) *seedstore.Store {
	t.Helper()
	newStore := seedstore.New
	if b.mysql {
		newStore = seedstore.NewMySQL
	}
	st, err := newStore(b.db, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (b *bundle) table(topic string) string {
	if topic == flowcatalyst.TopicDispatchJob {
		return b.schema + ".outbox_dispatch_jobs"
	}
	return b.schema + ".outbox_events"
}

// insert writes a PENDING row by plain SQL, as an application in any
// language would, and returns its id.
func (b *bundle) insert(t *testing.T, topic, group, payload string, createdAt time.Time) string {
	t.Helper()
	id := flowcatalyst.NewTSID().String()
	var g any
	if group != "" {
		g = group
	}
	_, err := b.dbExec(b.q(`INSERT INTO `+b.table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, $2, $3, $4, 'PENDING', 0, $5)`, []any{id, topic, g, payload, createdAt.UTC()}))
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return id
}

type seedRow struct {
	Status      string
	RetryCount  int
	ProcessedAt sql.NullTime
	Error       sql.NullString
}

func (b *bundle) row(t *testing.T, topic, id string) seedRow {
	t.Helper()
	var r seedRow
	err := b.dbQueryRow(b.q(`SELECT status, retry_count, processed_at, error_message FROM `+b.table(topic)+` WHERE id = $1`, []any{id})).
		Scan(&r.Status, &r.RetryCount, &r.ProcessedAt, &r.Error)
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	return r
}

func (b *bundle) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := b.dbExec(b.q(q, args)); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (b *bundle) dbExec(q string, args []any) (sql.Result, error) { return b.db.Exec(q, args...) }

func (b *bundle) dbQueryRow(q string, args []any) *sql.Row { return b.db.QueryRow(q, args...) }
