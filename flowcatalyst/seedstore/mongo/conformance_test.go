package mongo_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
)

// TestConformance runs the suite on FerretDB (in CI), which has no
// multi-document transactions: the caller's "transaction" is its context
// and writes at once, so the cases that need transactions skip.
func TestConformance(t *testing.T) {
	f := seedtest.Features
	f.Lacks = append(append([]storetest.Capability(nil), f.Lacks...), storetest.CapTransactions)
	// FerretDB writes each document of an update on its own, slowly: a
	// smaller processor run and fewer concurrent claimers keep the suite
	// shorter (the concurrent cases still run, with fewer claimers).
	f.ProcessorMessages, f.ProcessorTimeout, f.ConcurrentWriters = 100, 5*time.Minute, false
	storetest.Run(t, storetest.Harness[context.Context]{
		NewBackend: func(t *testing.T) storetest.Backend[context.Context] {
			m := testbackend.Mongo(t)
			st, err := mongo.New(m.DB, mongo.Options{UnorderedNullGroup: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.CreateTables(context.Background()); err != nil {
				t.Fatal(err)
			}
			return storetest.Backend[context.Context]{
				Store:    st,
				Enqueuer: st,
				Begin:    func(ctx context.Context) (context.Context, error) { return ctx, nil },
				Commit:   func(context.Context, context.Context) error { return nil },
				Rollback: func(context.Context, context.Context) error { return nil },
				Usable:   func(context.Context, context.Context) error { return nil },
			}
		},
		Features: f,
	})
}
