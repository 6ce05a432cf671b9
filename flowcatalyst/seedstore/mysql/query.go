package mysql

import (
	"context"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet returns one row by id (tenant must be ""), looking in the
// events table first.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	return s.shared.MessageGet(ctx, p)
}

// Ping implements outbox.Pinger, the processor's start-up probe: a
// one-row listing, which also finds missing tables.
func (s *Store) Ping(ctx context.Context) error { return s.shared.Ping(ctx) }

// MessageList returns rows ordered by id (a TSID, so by creation), filtered
// by status, topic and group. Pagination (AfterSeq) works for TSID ids.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.shared.MessageList(ctx, p)
}

// MessageCount counts rows of both tables by status (COMPLETED counts as
// SENT; every outbox status is present).
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	return s.shared.MessageCount(ctx, p)
}

// MessageRequeue moves a FAILED row back to PENDING, due now, with
// retry_count 0 and no error message.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	return s.shared.MessageRequeue(ctx, p)
}

// MessagePrune deletes COMPLETED and FAILED rows finished before p.Before,
// at most p.Limit (default 1000) per table and call. It refuses
// p.Statuses, p.Topic and p.DryRun (outbox.ErrInvalidInput) rather than
// delete more than asked.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	return s.shared.MessagePrune(ctx, p)
}

// AttemptList returns no attempts: the seed tables keep none. It returns
// outbox.ErrNotFound when the row does not exist.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	return s.shared.AttemptList(ctx, p)
}

// MessageApplyReceipt returns outbox.ErrNotFound: FlowCatalyst sends no
// receipts and the seed tables have no provider message id.
func (s *Store) MessageApplyReceipt(context.Context, outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return outbox.ReceiptResult{}, outbox.ErrNotFound
}

// MessageCancel returns an error matching errors.ErrUnsupported: the seed
// has no CANCELLED status, and writing one would break the seed's readers.
func (s *Store) MessageCancel(context.Context, outbox.MessageCancelParams) (outbox.Message, error) {
	return outbox.Message{}, seedcore.ErrCancel
}
