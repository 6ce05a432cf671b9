// Package storetest is the store conformance suite: the behaviour every
// outbox.Store adapter must have, run by each adapter's tests against its
// real database. One entry point, Run, runs every area as parallel subtests
// (each on a fresh backend) and then a second tier that runs whole
// outbox.Processors against the store.
//
// Every store in this module runs it; a store written elsewhere runs it the
// same way:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness[*sql.Tx]{
//			NewBackend: newBackend,
//			Features:   storetest.Features{ConcurrentWriters: true},
//		})
//	}
//
// # Capabilities
//
// The suite assumes every capability (see Capability). A store that lacks
// one declares it in Features.Lacks; the cases that need it are skipped with
// t.Skip, naming the capability, and every other case still runs. Declaring
// nothing runs everything: a missing declaration fails loudly rather than
// skipping quietly.
//
// # Leader election
//
// A store that offers single-active mode (an elector, like every store of
// this module) runs RunElector too, with an ElectorHarness: at most one
// leader at a time, the leadership released when a leader stops and taken
// over within the store's bound when a leader loses its session, and no
// goroutine left behind.
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
	// Inbox is the store's consumer inbox for TTx. It may be nil only when
	// Features.Lacks names CapInbox.
	Inbox outbox.InboxStore[TTx]
}

// Capability is something a store may lack. The suite skips exactly the
// cases that need a capability the store declares in Features.Lacks.
type Capability string

// The capabilities the suite knows.
const (
	// CapTransactions: MessageEnqueueTx writes in the caller's transaction,
	// atomically with the caller's own writes (a rollback leaves nothing),
	// and Backend.Begin, Commit and Rollback drive real transactions.
	CapTransactions Capability = "transactions"
	// CapConcurrentClaim: MessageClaim is atomic under concurrent claimers
	// (no message leased twice, FIFO per group kept).
	CapConcurrentClaim Capability = "concurrent atomic claim"
	// CapLockWait: a transaction that writes a key another open
	// transaction has written waits for that one to end, then goes on
	// (MongoDB aborts one of them with a write conflict instead).
	CapLockWait Capability = "transactions wait for locks"
	// CapReceipts: MessageApplyReceipt applies provider receipts.
	CapReceipts Capability = "receipts"
	// CapInbox: Backend.Inbox is the store's consumer inbox.
	CapInbox Capability = "inbox"
	// CapWakeups: the Store implements outbox.Waker.
	CapWakeups Capability = "wake-ups"
	// CapListInTx: the store lists messages in the caller's transaction
	// (sees its uncommitted writes).
	CapListInTx Capability = "list-in-tx"
	// CapTenants: messages carry a tenant and every query is scoped by it.
	CapTenants Capability = "tenants"
	// CapIdempotency: a repeated (tenant, idempotency key) returns the
	// stored message instead of inserting another.
	CapIdempotency Capability = "idempotency keys"
	// CapCancel: MessageCancel cancels a PENDING message.
	CapCancel Capability = "cancel"
	// CapAttemptHistory: AttemptList returns every recorded attempt.
	CapAttemptHistory Capability = "attempt history"
	// CapCallerIDs: a caller-chosen message ID is stored as given.
	CapCallerIDs Capability = "caller-chosen IDs"
	// CapAdmin: the Store implements outbox.Admin (operator search, bulk
	// requeue, topic stats, pauses honoured by the claim).
	CapAdmin Capability = "admin"
	// CapDeadLetterBlock: a dead letter recorded with BlockGroup (or by
	// MessageRecover under a blocking DeadLetterRule) holds its group until
	// it is requeued or cancelled (outbox.DeadLetterBlock).
	CapDeadLetterBlock Capability = "dead letter blocks its group"
	// CapCallerClock: the store takes its times from the caller (the Now,
	// ClaimedBefore and NextAttemptAt of the Params), so a case can move
	// time forward by passing a later Now. A store that reads its
	// database's clock instead (seed 004's tables) lacks it.
	CapCallerClock Capability = "caller's clock"
	// CapAnyTopic: the store accepts any topic name. A store with a fixed
	// set of topics lists them in Features.Topics; the cases that need
	// more distinct topics than it has are skipped, naming this capability
	// (it need not be declared in Lacks).
	CapAnyTopic Capability = "any topic"
	// CapBinaryPayloads: the store keeps any payload bytes (not only
	// JSON) and the message's ContentType. A store whose payload column
	// holds JSON text only (seed 004's tables) lacks it.
	CapBinaryPayloads Capability = "binary payloads and content types"
	// CapLeaseExtend: the Store implements outbox.LeaseExtender.
	CapLeaseExtend Capability = "lease extension"
)

// Capabilities returns every Capability the suite knows.
func Capabilities() []Capability {
	return []Capability{
		CapTransactions, CapConcurrentClaim, CapLockWait, CapReceipts, CapInbox, CapWakeups, CapListInTx,
		CapTenants, CapIdempotency, CapCancel, CapAttemptHistory, CapCallerIDs, CapAdmin, CapDeadLetterBlock, CapCallerClock, CapAnyTopic, CapBinaryPayloads, CapLeaseExtend,
	}
}

// Features declares what differs between stores.
type Features struct {
	// Lacks lists the capabilities the store does not have. The cases that
	// need one of them are skipped with a message naming it.
	Lacks []Capability
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
	// Topics, when set, are the only topics the store accepts (e.g. one
	// table per topic). The suite then maps the topic names its cases use
	// onto them, in order of first use within a case (the first name to
	// Topics[0], ...), and back in what the store returns, so every case
	// runs unchanged; a case that needs more distinct topics is skipped,
	// naming CapAnyTopic. The suite then drives the store through a
	// wrapper, so the optional interfaces (outbox.Waker, outbox.Admin,
	// ListerTx, outbox.PendingTopicLister) are not seen: declare them
	// lacking.
	Topics []string
}

// Harness is what an adapter passes to Run.
type Harness[TTx any] struct {
	// NewBackend returns a fresh backend for t; it registers its own
	// cleanup with t.Cleanup. It is called once per subtest, from parallel
	// subtests.
	NewBackend func(t *testing.T) Backend[TTx]
	Features   Features
}

// lacks reports whether the harness declares that the store lacks c.
func (h Harness[TTx]) lacks(c Capability) bool {
	for _, l := range h.Features.Lacks {
		if l == c {
			return true
		}
	}
	return false
}

// need skips t, naming the capability, unless the store has every one of
// caps.
func need[TTx any](t *testing.T, h Harness[TTx], caps ...Capability) {
	t.Helper()
	for _, c := range caps {
		if h.lacks(c) {
			t.Skipf("storetest: the store lacks the capability %q", c)
		}
	}
}
