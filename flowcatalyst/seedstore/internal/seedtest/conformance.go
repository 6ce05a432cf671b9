package seedtest

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
)

// Features is what seed 004's tables lack next to outboxkit's own
// stores: no tenant, idempotency key, headers, attempt history, receipts,
// CANCELLED status or inbox; ids of at most 13 characters; times from the
// database's clock; two topics, one per table.
var Features = storetest.Features{
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

// SQLStore is a SQL store as the conformance suite runs it.
type SQLStore interface {
	Store
	outbox.Enqueuer[*sql.Tx]
}

// SQLBackend is the suite's backend over st, a SQL store over b's tables
// with Options.UnorderedNullGroup (a NULL message_group is unordered, as
// outbox's Group ""): the rows go into the caller's *sql.Tx.
func SQLBackend(b *Bundle, st SQLStore) storetest.Backend[*sql.Tx] {
	return storetest.Backend[*sql.Tx]{
		Store:    st,
		Enqueuer: st,
		Begin:    func(ctx context.Context) (*sql.Tx, error) { return b.DB.BeginTx(ctx, nil) },
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		Usable: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		},
	}
}
