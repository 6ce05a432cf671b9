package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/postgres"
)

func newStore(t *testing.T, async bool) (*postgres.Store, testbackend.PostgresSchema) {
	t.Helper()
	pg := testbackend.Postgres(t, 12)
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, AsyncCommit: async})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, pg
}

// pgxBackend is the conformance suite's backend for s, with pgx
// transactions of pg's pool.
func pgxBackend(s *postgres.Store, pg testbackend.PostgresSchema) storetest.Backend[pgx.Tx] {
	return storetest.Backend[pgx.Tx]{
		Store:    s,
		Enqueuer: s,
		Inbox:    s,
		Begin:    func(ctx context.Context) (pgx.Tx, error) { return pg.Pool.Begin(ctx) },
		Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		Usable: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		},
	}
}

// TestConformance runs the store conformance suite with pgx transactions.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness[pgx.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[pgx.Tx] {
			return pgxBackend(newStore(t, false))
		},
		Features: storetest.Features{ConcurrentWriters: true},
	})
}

// TestConformanceDatabaseSQL runs the suite with database/sql transactions
// (pgx stdlib) for the enqueue side, and Options.AsyncCommit for the rest.
func TestConformanceDatabaseSQL(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[*sql.Tx] {
			s, pg := newStore(t, true)
			db := stdlib.OpenDBFromPool(pg.Pool)
			t.Cleanup(func() { _ = db.Close() })
			return storetest.Backend[*sql.Tx]{
				Store:    s,
				Enqueuer: s.SQL(),
				Inbox:    s.SQL(),
				Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
				Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
				Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
				Usable: func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "SELECT 1")
					return err
				},
			}
		},
		Features: storetest.Features{
			ConcurrentWriters: true,
			// MessageListTx takes a pgx.Tx; the *sql.Tx side has none.
			Lacks: []storetest.Capability{storetest.CapListInTx},
		},
	})
}
