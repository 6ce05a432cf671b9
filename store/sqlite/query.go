package sqlite

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet implements outbox.Store: the message with p.ID in p.Tenant, or
// an error wrapping outbox.ErrNotFound.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	return s.core.MessageGet(ctx, p)
}

// MessageList implements outbox.Store: a page of p.Tenant's messages in Seq
// order, optionally filtered by status, topic and group, starting after
// p.AfterSeq. Limit defaults to 100 and is capped at 1000.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.core.MessageList(ctx, p)
}

// MessageListTx is MessageList inside the caller's transaction tx, so it
// sees what tx enqueued before it commits (outboxtest.RequireEnqueuedTx uses
// it).
func (s *Store) MessageListTx(ctx context.Context, tx *sql.Tx, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.core.MessageListTx(ctx, tx, p)
}

// MessageCount implements outbox.Store: p.Tenant's messages (every tenant's
// with p.AllTenants) counted by status; every status is present in the map.
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	return s.core.MessageCount(ctx, p)
}

// AttemptList implements outbox.Store: the attempts of message p.MessageID in
// p.Tenant, oldest first. A message that does not exist in the tenant
// returns an error wrapping outbox.ErrNotFound.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	return s.core.AttemptList(ctx, p)
}

// MessagePendingTopics implements outbox.PendingTopicLister: the topics with
// PENDING messages due at or before p.DueBefore, across tenants, but for
// p.ExcludeTopics. The processor uses it to report topics nobody
// publishes.
func (s *Store) MessagePendingTopics(ctx context.Context, p outbox.MessagePendingTopicsParams) ([]outbox.PendingTopic, error) {
	return s.core.MessagePendingTopics(ctx, p)
}

// MessageRequeue implements outbox.Store: a FAILED message goes back to
// PENDING, due now, with its attempts reset to 0 (its attempt history is
// kept). Other statuses return an error wrapping
// outbox.ErrInvalidTransition; an unknown ID one wrapping outbox.ErrNotFound.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	return s.core.MessageRequeue(ctx, p)
}

// MessageCancel implements outbox.Store: a PENDING message or a dead letter
// (FAILED) becomes CANCELLED; a dead letter that blocked its group releases
// it. Other statuses return an error wrapping outbox.ErrInvalidTransition;
// an unknown ID one wrapping outbox.ErrNotFound.
func (s *Store) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	return s.core.MessageCancel(ctx, p)
}

// MessageApplyReceipt implements outbox.Store: it finds the message with the
// receipt's provider message ID in the receipt's tenant (else an error
// wrapping outbox.ErrNotFound), applies outbox.ApplyReceipt on the locked
// row, and writes the result back when it changed. Receipts are idempotent
// and never move a message backwards. A receipt without At is stamped with
// the store's clock.
func (s *Store) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return s.core.MessageApplyReceipt(ctx, p)
}

// MessagePrune implements outbox.Store: it deletes up to p.Limit (default
// 1000) finished messages (SENT, DELIVERED, FAILED, CANCELLED, or
// p.Statuses; of p.Topic when set) last updated before p.Before, oldest
// first, with their attempts, across all tenants; p.DryRun counts them
// instead. A dead letter that blocks its group is kept.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	return s.core.MessagePrune(ctx, p)
}

// DeadLetterBlocking implements outbox.DeadLetterBlocker: a dead letter
// recorded with BlockGroup holds its group (column blocks_group).
func (s *Store) DeadLetterBlocking() bool { return s.core.DeadLetterBlocking() }
