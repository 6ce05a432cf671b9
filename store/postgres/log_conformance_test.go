package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestConformanceLogMode runs the conformance suite on the append-only
// path (issue #28), as Options.AppendOnly sets it up (Migrate records it).
func TestConformanceLogMode(t *testing.T) {
	storetest.Run(t, storetest.Harness[pgx.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[pgx.Tx] {
			pg := testbackend.Postgres(t, 12)
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, AppendOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			return pgxBackend(s, pg)
		},
		Features: storetest.Features{ConcurrentWriters: true},
	})
}
