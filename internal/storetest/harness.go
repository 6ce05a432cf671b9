// Package storetest is the store conformance suite: the behaviour every
// outbox.Store adapter must have, run by each adapter's tests against its
// real database. One entry point, Run, runs every area as parallel subtests
// (each on a fresh backend) and then a second tier that runs whole
// outbox.Processors against the store.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness[*sql.Tx]{
//			NewBackend: newBackend,
//			Features:   storetest.Features{ConcurrentWriters: true},
//		})
//	}
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Backend is one fresh, migrated, empty store, isolated from every other
// test (its own database, schema or file), plus the hooks the suite needs to
// drive the caller's transactions of type TTx.
type Backend[TTx any] struct {
	Store    outbox.Store
	Enqueuer outbox.Enqueuer[TTx]
	// Begin starts a caller transaction.
	Begin func(ctx context.Context) (TTx, error)
	// Commit and Rollback end it.
	Commit   func(ctx context.Context, tx TTx) error
	Rollback func(ctx context.Context, tx TTx) error
	// Usable runs a trivial statement in tx; it returns an error when the
	// transaction is aborted or unusable.
	Usable func(ctx context.Context, tx TTx) error
	// Inbox is the store's consumer inbox for TTx, optional: the Inbox
	// area is skipped when it is nil.
	Inbox outbox.InboxStore[TTx]
}

// Features declares what differs between stores.
type Features struct {
	// ConcurrentWriters is true when several transactions can enqueue at
	// the same time without serialising (false for SQLite). When true, the
	// concurrency tests run more claimers at once.
	ConcurrentWriters bool
	// ProcessorMessages is the number of messages of the processor-tier
	// FIFO test (4 processors, 100 groups, 20% retryable failures).
	// Defaults to 10,000, or 1,000 with -short.
	ProcessorMessages int
	// ProcessorTimeout bounds each processor-tier test. Defaults to 3
	// minutes.
	ProcessorTimeout time.Duration
}

// Harness is what an adapter passes to Run.
type Harness[TTx any] struct {
	// NewBackend returns a fresh backend for t; it registers its own
	// cleanup with t.Cleanup. It is called once per subtest, from parallel
	// subtests.
	NewBackend func(t *testing.T) Backend[TTx]
	Features   Features
}
