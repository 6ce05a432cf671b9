package seedsql

import (
	"context"
	"fmt"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// Insert validates items, then writes them as PENDING rows through ex, and
// returns their ids in order.
func (s *Store) Insert(ctx context.Context, ex Execer, items []seedcore.Item) ([]string, error) {
	rows, err := s.Core.PrepareItems(items)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rows))
	for i, it := range rows {
		t := s.TableOf(it.Topic)
		var group any
		if it.Group != "" {
			group = it.Group
		}
		var due any
		if !it.DueAt.IsZero() {
			due = seedcore.At(it.DueAt)
		}
		if _, err := ex.ExecContext(ctx, t.Insert, it.ID, it.Topic, group, string(it.Payload), seedcore.At(it.CreatedAt), due); err != nil {
			return nil, fmt.Errorf("seedstore: insert into %s: %w", t.Raw, err)
		}
		ids[i] = it.ID
	}
	return ids, nil
}

// Enqueue writes p's messages in a transaction of its own.
func (s *Store) Enqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	items, err := s.Core.ItemsOf(p, s.d.StrictOrder)
	if err != nil {
		return nil, err
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("seedstore: enqueue: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	out, err := s.enqueue(ctx, tx, items)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("seedstore: enqueue: %w", err)
	}
	return out, nil
}

// EnqueueTx writes p's messages through ex, the caller's transaction.
func (s *Store) EnqueueTx(ctx context.Context, ex Execer, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	items, err := s.Core.ItemsOf(p, s.d.StrictOrder)
	if err != nil {
		return nil, err
	}
	return s.enqueue(ctx, ex, items)
}

// enqueue inserts items through ex and returns the stored messages.
func (s *Store) enqueue(ctx context.Context, ex Execer, items []seedcore.Item) ([]outbox.Enqueued, error) {
	if _, err := s.Insert(ctx, ex, items); err != nil {
		return nil, err
	}
	return s.Core.Enqueued(items, s.d.Precision), nil
}
