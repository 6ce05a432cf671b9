package seedstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
)

// seedFeatures is what seed 004's tables lack next to outboxkit's own
// stores: no tenant, idempotency key, headers, attempt history, receipts,
// CANCELLED status or inbox; ids of at most 13 characters; times from the
// database's clock; two topics, one per table.
var seedFeatures = storetest.Features{
	Lacks: []storetest.Capability{
		storetest.CapTenants, storetest.CapIdempotency, storetest.CapCancel, storetest.CapAttemptHistory,
		storetest.CapCallerIDs, storetest.CapReceipts, storetest.CapInbox, storetest.CapWakeups,
		storetest.CapListInTx, storetest.CapAdmin, storetest.CapCallerClock, storetest.CapDeadLetterBlock, storetest.CapBinaryPayloads,
		storetest.CapLeaseExtend,
	},
	ConcurrentWriters: true,
	Topics:            []string{flowcatalyst.TopicEvent, flowcatalyst.TopicDispatchJob},
	ProcessorMessages: 2000,
}

// sqlBackend is the suite's backend over a SQL Store: the rows go into the
// caller's *sql.Tx. A NULL message_group is unordered (the option
// UnorderedNullGroup), as outbox's Group "".
func sqlBackend(t *testing.T, b *bundle) storetest.Backend[*sql.Tx] {
	opts := b.opts
	opts.UnorderedNullGroup = true
	newStore := seedstore.New
	if b.mysql {
		newStore = seedstore.NewMySQL
	}
	st, err := newStore(b.db, opts)
	if err != nil {
		t.Fatal(err)
	}
	return storetest.Backend[*sql.Tx]{
		Store:    st,
		Enqueuer: st,
		Begin:    func(ctx context.Context) (*sql.Tx, error) { return b.db.BeginTx(ctx, nil) },
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		Usable: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		},
	}
}

func TestConformancePostgres(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[*sql.Tx] { return sqlBackend(t, setup(t)) },
		Features:   seedFeatures,
	})
}

func TestConformanceMySQL(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[*sql.Tx] { return sqlBackend(t, setupMySQL(t)) },
		Features:   seedFeatures,
	})
}

// mongoEnqueuer is the Store's Enqueuer on MongoDB: the "transaction" is
// the context carrying the caller's session, as in store/mongo.
type mongoEnqueuer struct{ *seedstore.Store }

func (e mongoEnqueuer) MessageEnqueueTx(_ context.Context, tx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return e.MessageEnqueue(tx, p)
}

// TestConformanceMongo runs the suite on FerretDB (in CI), which has no
// multi-document transactions: the caller's "transaction" is its context
// and writes at once, so the cases that need transactions skip.
func TestConformanceMongo(t *testing.T) {
	f := seedFeatures
	f.Lacks = append(append([]storetest.Capability(nil), f.Lacks...), storetest.CapTransactions)
	// FerretDB writes each document of an update on its own, slowly: a
	// smaller processor run and fewer concurrent claimers keep the suite
	// shorter (the concurrent cases still run, with fewer claimers).
	f.ProcessorMessages, f.ProcessorTimeout, f.ConcurrentWriters = 100, 5*time.Minute, false
	storetest.Run(t, storetest.Harness[context.Context]{
		NewBackend: func(t *testing.T) storetest.Backend[context.Context] {
			m := testbackend.Mongo(t)
			st, err := seedstore.NewMongo(m.DB, seedstore.Options{UnorderedNullGroup: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.CreateTables(context.Background()); err != nil {
				t.Fatal(err)
			}
			return storetest.Backend[context.Context]{
				Store:    st,
				Enqueuer: mongoEnqueuer{st},
				Begin:    func(ctx context.Context) (context.Context, error) { return ctx, nil },
				Commit:   func(context.Context, context.Context) error { return nil },
				Rollback: func(context.Context, context.Context) error { return nil },
				Usable:   func(context.Context, context.Context) error { return nil },
			}
		},
		Features: f,
	})
}
