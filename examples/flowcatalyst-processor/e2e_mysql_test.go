package main

import (
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// setupE2EMySQL creates a fresh MySQL/MariaDB database holding seed 004's
// tables, created by plain SQL with the seed's DDL.
func setupE2EMySQL(t *testing.T) *e2e {
	t.Helper()
	tdb := testbackend.MySQL(t, 4)
	e := &e2e{db: tdb.DB, dsn: tdb.DSN, schema: tdb.Name, srv: flowcatalysttest.NewServer(), mysql: true}
	t.Cleanup(e.srv.Close)
	for _, table := range []string{"outbox_events", "outbox_dispatch_jobs"} {
		for _, ddl := range []string{`CREATE TABLE ` + table + ` (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
)`, `CREATE INDEX idx_` + table + `_status ON ` + table + `(status, message_group, created_at)`} {
			if _, err := e.db.Exec(ddl); err != nil {
				t.Fatal(err)
			}
		}
	}
	return e
}

// insertMySQL writes n rows in groups into topic's table by plain SQL, ids
// prefix+i, one second apart (TIMESTAMP has whole seconds on MySQL).
func (e *e2e) insertMySQL(t *testing.T, db *sql.DB, topic, prefix string, groups, n int) {
	t.Helper()
	var vals []string
	var args []any
	for i := 1; i <= n; i++ {
		g := fmt.Sprint("g", i%groups)
		vals = append(vals, `(?, ?, ?, ?, 'PENDING', 0, NOW() - INTERVAL 1 HOUR + INTERVAL ? SECOND)`)
		args = append(args, fmt.Sprint(prefix, i), topic, g, fmt.Sprintf(`{"topic":%q,"group":%q,"n":%d}`, topic, g, i), i)
	}
	if _, err := db.Exec(`INSERT INTO `+e.table(topic)+` (id, type, message_group, payload, status, retry_count, created_at) VALUES `+
		strings.Join(vals, ", "), args...); err != nil {
		t.Fatal(err)
	}
}

// The program on MariaDB/MySQL: rows by plain SQL with ids shared across
// the two tables, every fifth request failing with 503, two replicas of
// which one is active (GET_LOCK), a clean stop.
func TestEndToEndMySQL(t *testing.T) {
	t.Parallel()
	e := setupE2EMySQL(t)
	var requests atomic.Int64
	e.srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		if requests.Add(1)%5 == 0 {
			return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"try again"}`)}
		}
		return nil
	})
	const n = 400
	e.insertMySQL(t, e.db, "EVENT", "P", 4, n)
	e.insertMySQL(t, e.db, "DISPATCH_JOB", "P", 4, n)
	args := []string{"-api-batch-size", "10", "-max-retries", "20", "-single-active"}
	a, la := e.start(t, args...)
	b, lb := e.start(t, args...)
	waitLong(t, "every row COMPLETED", func() bool {
		return e.count(t, "EVENT", "COMPLETED") == n && e.count(t, "DISPATCH_JOB", "COMPLETED") == n
	})
	active := strings.Count(la.String(), "now the active one") + strings.Count(lb.String(), "now the active one")
	stop(t, a, la)
	stop(t, b, lb)
	if active != 1 {
		t.Errorf("%d replicas became active while both ran, want 1:\n%s\n%s", active, la.String(), lb.String())
	}
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.EventsPath), 4, n, true)
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.DispatchJobsPath), 4, n, true)
	var retried int
	if err := e.db.QueryRow(`SELECT (SELECT count(*) FROM ` + e.table("EVENT") + ` WHERE retry_count > 0) + (SELECT count(*) FROM ` + e.table("DISPATCH_JOB") + ` WHERE retry_count > 0)`).Scan(&retried); err != nil {
		t.Fatal(err)
	}
	if retried == 0 {
		t.Error("no row was charged a retry although every fifth request failed")
	}
	for _, topic := range []string{"EVENT", "DISPATCH_JOB"} {
		if p := e.count(t, topic, "PROCESSING"); p != 0 {
			t.Errorf("%d %s rows left PROCESSING after a clean stop", p, topic)
		}
	}
}

func TestEndToEndMySQLKillAndRestart(t *testing.T) {
	t.Parallel()
	testKillAndRestart(t, setupE2EMySQL(t), 1000, 2)
}

func TestEndToEndMySQLIDsSharedAcrossTables(t *testing.T) {
	t.Parallel()
	testIDsSharedAcrossTables(t, setupE2EMySQL(t))
}
