package sqlite

import "context"

// Wakeups implements outbox.Waker: the returned channel receives a value
// soon after messages became claimable through this Store: after
// MessageEnqueue and InTx commit, and after MessageFinish, MessageRecover,
// MessageRequeue and MessageCancel changed something (a finished message
// unblocks the next one of its group). Signals are coalesced: a slow reader
// sees one value for many events. The channel is closed when ctx ends or the
// Store is closed.
//
// The signal is in-process only. Messages enqueued with MessageEnqueueTx
// (outbox.Outbox.EnqueueTx) in a transaction the application commits itself
// are not signalled, because the store cannot see the commit: call Notify
// after the commit, use InTx, or rely on the processor's poll interval.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} { return s.wake.Subscribe(ctx) }

// Notify wakes every Wakeups listener, e.g. right after the application
// committed a transaction in which it enqueued messages with
// MessageEnqueueTx. It never blocks.
func (s *Store) Notify() { s.wake.Notify() }
