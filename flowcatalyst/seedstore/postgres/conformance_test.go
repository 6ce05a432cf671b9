package postgres_test

import (
	"database/sql"
	"testing"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[*sql.Tx] {
			b := setup(t)
			opts := optionsOf(b)
			opts.UnorderedNullGroup = true
			st, err := postgres.New(b.DB, opts)
			if err != nil {
				t.Fatal(err)
			}
			return seedtest.SQLBackend(b, st)
		},
		Features: seedtest.Features,
	})
}
