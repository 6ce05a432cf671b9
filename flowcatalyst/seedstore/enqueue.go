package seedstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageEnqueue implements outbox.Enqueuer: it writes the messages as
// PENDING rows (documents on MongoDB) in a transaction of its own; see
// MessageEnqueueTx for the mapping.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	items, err := s.itemsOf(p)
	if err != nil {
		return nil, err
	}
	if s.mg != nil {
		return s.enqueued(items, func(it []Item) ([]string, error) { return s.InsertMongo(ctx, it...) })
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("seedstore: enqueue: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	out, err := s.enqueued(items, func(it []Item) ([]string, error) { return s.Insert(ctx, tx, it...) })
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("seedstore: enqueue: %w", err)
	}
	return out, nil
}

// MessageEnqueueTx implements outbox.Enqueuer[*sql.Tx] for the SQL Stores:
// the rows are written in tx and exist if and only if it commits, so
// outbox.New[*sql.Tx](store, ...) enqueues into seed 004's tables.
//
// The seed's row has fewer fields than an outbox.Message: the Topic picks
// the table (flowcatalyst.TopicEvent or flowcatalyst.TopicDispatchJob),
// Group is message_group ("" is NULL), Payload the payload, CreatedAt the
// created_at, a future NextAttemptAt the processed_at of the PENDING row
// (its due time). An ID of at most 13 characters is kept; a longer one (the
// ULID outbox.Outbox assigns) is replaced by a new TSID, the id the seed's
// readers expect. A Tenant, Headers or an IdempotencyKey other than the ID
// have no column and are refused with an error matching
// outbox.ErrInvalidInput (MaxAttempts is the processor's, not the row's).
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if s.mg != nil {
		return nil, errors.New("seedstore: MessageEnqueueTx takes a *sql.Tx; on MongoDB use MessageEnqueue with the session's context")
	}
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	items, err := s.itemsOf(p)
	if err != nil {
		return nil, err
	}
	return s.enqueued(items, func(it []Item) ([]string, error) { return s.Insert(ctx, tx, it...) })
}

// itemsOf maps p's messages to rows; see MessageEnqueueTx.
func (s *Store) itemsOf(p outbox.MessageEnqueueParams) ([]Item, error) {
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	out := make([]Item, len(p.Messages))
	for i := range p.Messages {
		m := p.Messages[i]
		if !p.Prepared {
			if err := outbox.PrepareMessage(&m, now); err != nil {
				return nil, err
			}
		}
		field := func(f string) string { return fmt.Sprintf("Messages[%d].%s", i, f) }
		switch {
		case m.Tenant != "":
			return nil, outbox.InvalidParam(field("Tenant"), "seed 004's tables have no tenant")
		case len(m.Headers) > 0:
			return nil, outbox.InvalidParam(field("Headers"), "seed 004's tables have no headers")
		case m.IdempotencyKey != "" && m.IdempotencyKey != m.ID:
			return nil, outbox.InvalidParam(field("IdempotencyKey"), "seed 004's tables have no idempotency key")
		}
		id := m.ID
		if len(id) > flowcatalyst.TSIDLen {
			id = flowcatalyst.NewTSID().String()
		}
		it := Item{Topic: m.Topic, Group: m.Group, Payload: m.Payload, ID: id, CreatedAt: m.CreatedAt}
		if m.NextAttemptAt.After(now) {
			it.DueAt = m.NextAttemptAt
		}
		if it.CreatedAt.IsZero() {
			it.CreatedAt = now
		}
		// Rows of one group with equal created_at have no order on
		// PostgreSQL (the seed orders by created_at alone): each message
		// gets a later created_at than the one before, by a microsecond if
		// need be.
		s.mu.Lock()
		if c := at(it.CreatedAt); !s.mysql && s.mg == nil && !c.After(s.lastCreated) {
			it.CreatedAt = s.lastCreated.Add(time.Microsecond)
		}
		s.lastCreated = at(it.CreatedAt)
		s.mu.Unlock()
		out[i] = it
	}
	return out, nil
}

// enqueued inserts items with insert and returns the stored messages.
func (s *Store) enqueued(items []Item, insert func([]Item) ([]string, error)) ([]outbox.Enqueued, error) {
	if _, err := insert(items); err != nil {
		return nil, err
	}
	out := make([]outbox.Enqueued, len(items))
	for i, it := range items {
		r := row{id: it.ID, typ: it.Topic, payload: string(it.Payload), status: StatusPending, createdAt: s.stored(it.CreatedAt)}
		if it.Group != "" {
			r.group.String, r.group.Valid = it.Group, true
		}
		if !it.DueAt.IsZero() {
			r.processedAt.Time, r.processedAt.Valid = s.stored(it.DueAt), true
		}
		out[i] = outbox.Enqueued{Message: s.message(&r, it.Topic)}
	}
	return out, nil
}

// stored returns t as the database stores it: microseconds on PostgreSQL,
// milliseconds on MongoDB, whole seconds on MySQL.
func (s *Store) stored(t time.Time) time.Time {
	switch {
	case s.mg != nil:
		return at(t).Truncate(time.Millisecond)
	case s.mysql:
		return at(t).Truncate(time.Second)
	}
	return at(t)
}
