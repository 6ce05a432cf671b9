package mysql_test

import (
	"database/sql"
	"testing"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mysql"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// seedDDLMySQL is seed 004's schema, verbatim, one statement per entry.
var seedDDLMySQL = []string{`CREATE TABLE outbox_events (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
)`, `CREATE INDEX idx_outbox_events_status
    ON outbox_events(status, message_group, created_at)`, `CREATE TABLE outbox_dispatch_jobs (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
)`, `CREATE INDEX idx_outbox_dispatch_jobs_status
    ON outbox_dispatch_jobs(status, message_group, created_at)`}

// setup creates a fresh MySQL/MariaDB database holding the seed's
// tables (by plain SQL) and returns a MySQL Store over them.
func setup(t testing.TB) *seedtest.Bundle {
	t.Helper()
	tdb := testbackend.MySQL(t, 2)
	dsn, err := mysql.DSN(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	for _, stmt := range seedDDLMySQL {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("create tables: %v", err)
		}
	}
	b := &seedtest.Bundle{DB: db, Schema: tdb.Name, MySQL: true, DSN: dsn}
	b.New = func(t testing.TB) seedtest.Store {
		st, err := mysql.New(db, optionsOf(b))
		if err != nil {
			t.Fatalf("mysql.New: %v", err)
		}
		return st
	}
	b.SetBeforeForget = func(st seedtest.Store, f func()) { mysql.SetBeforeForget(st.(*mysql.Store), f) }
	b.Store = b.New(t)
	return b
}

// optionsOf returns the Options of a Store over b's tables.
func optionsOf(b *seedtest.Bundle) mysql.Options {
	return mysql.Options{EventsTable: b.Table(flowcatalyst.TopicEvent), DispatchJobsTable: b.Table(flowcatalyst.TopicDispatchJob)}
}
