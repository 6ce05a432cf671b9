package testbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresDefaultDSN is the CI machine's server (trust auth).
const PostgresDefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// PostgresDSN returns the DSN of the test PostgreSQL: OUTBOXKIT_POSTGRES_DSN,
// else the local server on 127.0.0.1:5432 when it answers. When neither
// works t is skipped (or fails when backends are required).
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn, why := LookupOrStart("OUTBOXKIT_POSTGRES_DSN", PostgresDefaultDSN, "127.0.0.1:5432", PostgresContainer)
	if dsn == "" {
		Unavailable(t, "PostgreSQL", why)
	}
	return dsn
}

// PostgresSchema is one test's isolated schema on the test server.
type PostgresSchema struct {
	// Pool is connected to the test server; it is closed when the test ends.
	Pool *pgxpool.Pool
	// Name is a fresh schema, created empty and dropped (CASCADE) when the
	// test ends. Objects of the test go in it, so tests run in parallel.
	Name string
	// DSN is the server's connection string, for extra connections.
	DSN string
}

// Postgres returns a pool on the test PostgreSQL that answered a ping, and
// a fresh schema unique to t. maxConns caps the pool (0 means 8). The schema
// is dropped and the pool closed when t ends.
func Postgres(t testing.TB, maxConns int32) PostgresSchema {
	t.Helper()
	dsn := PostgresDSN(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testbackend: OUTBOXKIT_POSTGRES_DSN: %v", err)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = maxConns
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "outboxkit-test"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		Unavailable(t, "PostgreSQL", err.Error())
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		Unavailable(t, "PostgreSQL", "ping: "+err.Error())
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		pool.Close()
		t.Fatalf("testbackend: create schema: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A fresh connection: the pool may be unusable after a test that
		// broke it on purpose.
		if c, err := pgx.Connect(ctx, dsn); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
			_ = c.Close(ctx)
		}
	})
	return PostgresSchema{Pool: pool, Name: name, DSN: dsn}
}

// HoldHorizon opens a transaction on a connection of p that holds
// PostgreSQL's cleanup horizon (it has a transaction ID), runs after more
// transactions after it on other connections, and returns the holding
// session's process ID. The transaction is rolled back when t ends; p
// needs a connection free besides the one it holds.
func (p PostgresSchema) HoldHorizon(t testing.TB, after int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := p.Pool.Begin(ctx)
	if err != nil {
		t.Fatalf("testbackend: hold the horizon: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM (SELECT txid_current()) x`).Scan(&pid); err != nil {
		t.Fatalf("testbackend: hold the horizon: %v", err)
	}
	for range after {
		if _, err := p.Pool.Exec(ctx, `SELECT txid_current()`); err != nil {
			t.Fatalf("testbackend: a transaction after the horizon: %v", err)
		}
	}
	return pid
}
