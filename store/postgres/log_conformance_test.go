package postgres_test

import (
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
			return pgxBackend(s, pg)
		},
		Features: storetest.Features{ConcurrentWriters: true},
	})
}
