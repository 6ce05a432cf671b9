package mysql

import (
	"context"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageSearch implements outbox.Admin: messages of every tenant matching
// p.Filter, in Seq order, a page at a time.
func (s *Store) MessageSearch(ctx context.Context, p outbox.MessageSearchParams) (outbox.MessagePage, error) {
	return s.core.MessageSearch(ctx, p)
}

// MessageRequeueMany implements outbox.Admin: up to p.Limit FAILED messages
// matching p.Filter after p.AfterSeq go back to PENDING (due p.Now,
// attempts reset) in one transaction.
func (s *Store) MessageRequeueMany(ctx context.Context, p outbox.MessageRequeueManyParams) (outbox.RequeueManyResult, error) {
	return s.core.MessageRequeueMany(ctx, p)
}

// TopicStats implements outbox.Admin. It reads the whole messages table
// (of the selected tenants): an operator's query, not one for a hot path.
func (s *Store) TopicStats(ctx context.Context, p outbox.TopicStatsParams) ([]outbox.TopicStat, error) {
	return s.core.TopicStats(ctx, p)
}

// PauseAdd implements outbox.Admin.
func (s *Store) PauseAdd(ctx context.Context, p outbox.PauseAddParams) error {
	return s.core.PauseAdd(ctx, p)
}

// PauseRemove implements outbox.Admin.
func (s *Store) PauseRemove(ctx context.Context, p outbox.PauseRemoveParams) (bool, error) {
	return s.core.PauseRemove(ctx, p)
}

// PauseList implements outbox.Admin.
func (s *Store) PauseList(ctx context.Context, p outbox.PauseListParams) ([]outbox.Pause, error) {
	return s.core.PauseList(ctx, p)
}

// PausesTable returns the name of the pauses table (outbox.Admin), for the
// claim's pause check.
func (s *Store) PausesTable() string { return s.core.PausesTable() }
