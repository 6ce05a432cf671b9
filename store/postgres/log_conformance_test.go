package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestConformanceLogMode runs the conformance suite on the append-only
// path (issue #28) while it is built.
func TestConformanceLogMode(t *testing.T) {
	storetest.Run(t, storetest.Harness[pgx.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[pgx.Tx] {
			s, pg := newStore(t, false)
			postgres.EnableLogMode(s)
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
		},
		Features: storetest.Features{ConcurrentWriters: true},
	})
}
