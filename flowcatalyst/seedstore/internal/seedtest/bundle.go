// Package seedtest holds the tests the stores over seed 004's tables
// (flowcatalyst/seedstore/postgres, mysql and mongo) share: the cases that
// run on every SQL store, the helpers they use, the conformance suite's
// features and the throughput benchmark.
package seedtest

import (
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// Store is what the shared cases need of a store; every seed store has it.
type Store interface {
	outbox.Store
	outbox.Waker
	outbox.Pinger
	Topics() []string
}

var (
	dollarRE   = regexp.MustCompile(`\$([0-9]+)`)
	intervalRE = regexp.MustCompile(`interval '([0-9]+) (second|minute|hour)s?'`)
)

// Bundle is a SQL store over seed tables of its own (in Schema) for one
// test.
type Bundle struct {
	DB     *sql.DB
	Schema string // the schema (PostgreSQL) or database (MySQL) of the tables
	Store  Store
	MySQL  bool   // MySQL/MariaDB: statements are rewritten by Q
	DSN    string // MySQL/MariaDB: the DSN DB was opened with
	// New returns another Store over the same tables (another processor).
	New func(t testing.TB) Store
	// SetBeforeForget sets the store's test hook that runs between a
	// finish's commit and its forget, before the store is used.
	SetBeforeForget func(st Store, f func())
}

// Row is a seed row as the tests read it.
type Row struct {
	Status      string
	RetryCount  int
	ProcessedAt sql.NullTime
	Error       sql.NullString
}

// Q returns query and args for b's database: on MySQL every $N becomes ?
// with args reordered (and repeated) to match.
func (b *Bundle) Q(query string, args []any) (string, []any) {
	if !b.MySQL || !dollarRE.MatchString(query) && !strings.Contains(query, "now() AT") {
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

// Table returns the name of topic's table.
func (b *Bundle) Table(topic string) string {
	if topic == flowcatalyst.TopicDispatchJob {
		return b.Schema + ".outbox_dispatch_jobs"
	}
	return b.Schema + ".outbox_events"
}

// Insert writes a PENDING row by plain SQL, as an application in any
// language would, and returns its id.
func (b *Bundle) Insert(t *testing.T, topic, group, payload string, createdAt time.Time) string {
	t.Helper()
	id := flowcatalyst.NewTSID().String()
	var g any
	if group != "" {
		g = group
	}
	_, err := b.dbExec(b.Q(`INSERT INTO `+b.Table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, $2, $3, $4, 'PENDING', 0, $5)`, []any{id, topic, g, payload, createdAt.UTC()}))
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return id
}

// Row reads the row id of topic's table.
func (b *Bundle) Row(t *testing.T, topic, id string) Row {
	t.Helper()
	var r Row
	err := b.QueryRow(b.Q(`SELECT status, retry_count, processed_at, error_message FROM `+b.Table(topic)+` WHERE id = $1`, []any{id})).
		Scan(&r.Status, &r.RetryCount, &r.ProcessedAt, &r.Error)
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	return r
}

// Exec runs q (rewritten by Q) or fails the test.
func (b *Bundle) Exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := b.dbExec(b.Q(q, args)); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (b *Bundle) dbExec(q string, args []any) (sql.Result, error) { return b.DB.Exec(q, args...) }

// QueryRow runs q and returns its row.
func (b *Bundle) QueryRow(q string, args []any) *sql.Row { return b.DB.QueryRow(q, args...) }

// DBNow is the database's clock, as the store writes processed_at.
func (b *Bundle) DBNow(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	if err := b.QueryRow(b.Q(`SELECT now() AT TIME ZONE 'UTC'`, nil)).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// MakeDue makes a PENDING row waiting for a retry due now.
func (b *Bundle) MakeDue(t *testing.T, topic, id string) {
	t.Helper()
	b.Exec(t, `UPDATE `+b.Table(topic)+` SET processed_at = now() AT TIME ZONE 'UTC' - interval '1 second' WHERE id = $1 AND status = 'PENDING'`, id)
}

// CountStatus counts both tables' rows with status.
func (b *Bundle) CountStatus(t *testing.T, status string) int {
	t.Helper()
	var n int
	err := b.QueryRow(b.Q(`SELECT (SELECT count(*) FROM `+b.Table("EVENT")+` WHERE status = $1) + (SELECT count(*) FROM `+b.Table("DISPATCH_JOB")+` WHERE status = $1)`, []any{status})).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// InsertGroups inserts per[g] rows for each group g, interleaved in time.
func (b *Bundle) InsertGroups(t *testing.T, topic string, per map[string]int) {
	t.Helper()
	at := time.Now().UTC().Add(-time.Hour)
	for i := 0; ; i++ {
		any := false
		for g, n := range per {
			if i >= n {
				continue
			}
			any = true
			at = at.Add(time.Millisecond)
			b.Insert(t, topic, g, fmt.Sprintf(`{"group":%q,"n":%d,"source":"test"}`, g, i), at)
		}
		if !any {
			return
		}
	}
}
