package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageEnqueue implements outbox.Enqueuer: it inserts p.Messages in a
// transaction of its own, commits, and wakes the Wakeups listeners.
// Messages are validated first (a *outbox.ValidationError matching
// outbox.ErrInvalidInput, nothing inserted); a repeated (Tenant,
// IdempotencyKey) returns the stored message with Existed = true.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	var out []outbox.Enqueued
	err = s.writeTx(ctx, func(q querier) error {
		var err error
		out, err = s.insert(ctx, q, msgs)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.Notify()
	return out, nil
}

// MessageEnqueueTx implements outbox.Enqueuer[*sql.Tx]: it inserts
// p.Messages in the caller's transaction tx, so they exist if and only if tx
// commits. Invalid messages are refused before any statement runs, and a
// repeated (Tenant, IdempotencyKey) inserts nothing (INSERT ... ON CONFLICT
// DO NOTHING) and returns the stored message with Existed = true: in both
// cases tx stays usable.
//
// The store cannot see when tx commits, so Wakeups is not signalled: use
// InTx, call Notify after the commit, or let the processor's poll interval
// pick the messages up.
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	return s.insert(ctx, tx, msgs)
}

// prepare validates and completes copies of the messages, so the store is
// safe to call directly, without outbox.Outbox: it fills ID, IdempotencyKey,
// CreatedAt, UpdatedAt and NextAttemptAt when empty, and forces the
// store-owned fields (Status PENDING, no attempts, no lease).
func (s *Store) prepare(p outbox.MessageEnqueueParams) ([]outbox.Message, error) {
	now := s.now(p.Now)
	out := make([]outbox.Message, len(p.Messages))
	for i, m := range p.Messages {
		if err := outbox.ValidateMessage(&m); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		if m.ID == "" {
			m.ID = outbox.NewID(now)
		}
		if m.IdempotencyKey == "" {
			m.IdempotencyKey = m.ID
		}
		if m.CreatedAt.IsZero() {
			m.CreatedAt = now
		}
		m.CreatedAt = m.CreatedAt.UTC().Truncate(time.Microsecond)
		if m.UpdatedAt.IsZero() {
			m.UpdatedAt = m.CreatedAt
		}
		if m.NextAttemptAt.IsZero() {
			m.NextAttemptAt = m.CreatedAt
		}
		m.Status = outbox.StatusPending
		m.Attempts = 0
		out[i] = m
	}
	return out, nil
}

// insert inserts prepared messages with q (the caller's tx or the store's
// connection). A conflict on (tenant, idempotency_key) inserts nothing and
// reads the original back.
func (s *Store) insert(ctx context.Context, q querier, msgs []outbox.Message) ([]outbox.Enqueued, error) {
	out := make([]outbox.Enqueued, 0, len(msgs))
	ins, err := q.PrepareContext(ctx, s.q.insert)
	if err != nil {
		return nil, fmt.Errorf("sqlite: enqueue: %w", err)
	}
	defer ins.Close()
	for i, m := range msgs {
		var headers any
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("Headers", err.Error()))
			}
			headers = string(b)
		}
		stored, err := scanMessage(ins.QueryRowContext(ctx,
			m.ID, m.Tenant, m.Topic, m.Group, m.IdempotencyKey, string(m.Payload), headers,
			m.MaxAttempts, m.NextAttemptAt.UnixMicro(), m.CreatedAt.UnixMicro(), m.UpdatedAt.UnixMicro()))
		switch {
		case err == nil:
			out = append(out, outbox.Enqueued{Message: stored})
			continue
		case !isNoRows(err):
			return nil, fmt.Errorf("sqlite: enqueue message %d: %w", i, err)
		}
		// Nothing inserted: a UNIQUE conflict, on the idempotency key (the
		// original is returned) or on the ID (another message has it).
		stored, err = scanMessage(q.QueryRowContext(ctx, s.q.selectByKey, m.Tenant, m.IdempotencyKey))
		if isNoRows(err) {
			return nil, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("ID", fmt.Sprintf("%q is already used by another message", m.ID)))
		}
		if err != nil {
			return nil, fmt.Errorf("sqlite: enqueue message %d: read the original: %w", i, err)
		}
		out = append(out, outbox.Enqueued{Message: stored, Existed: true})
	}
	return out, nil
}
