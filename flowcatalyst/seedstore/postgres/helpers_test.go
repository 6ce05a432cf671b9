package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
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

// setup connects to PostgreSQL, creates a fresh schema holding the seed's
// tables (by plain SQL, as an application would) and returns a Store over
// them. The schema is dropped when the test ends.
func setup(t testing.TB) *seedtest.Bundle {
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
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema := "seedstore_" + hex.EncodeToString(rnd[:])
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
	b := &seedtest.Bundle{DB: db, Schema: schema}
	b.New = func(t testing.TB) seedtest.Store {
		st, err := postgres.New(db, optionsOf(b))
		if err != nil {
			t.Fatalf("postgres.New: %v", err)
		}
		return st
	}
	b.SetBeforeForget = func(st seedtest.Store, f func()) { postgres.SetBeforeForget(st.(*postgres.Store), f) }
	b.Store = b.New(t)
	return b
}

// optionsOf returns the Options of a Store over b's tables.
func optionsOf(b *seedtest.Bundle) postgres.Options {
	return postgres.Options{EventsTable: b.Table(flowcatalyst.TopicEvent), DispatchJobsTable: b.Table(flowcatalyst.TopicDispatchJob)}
}
