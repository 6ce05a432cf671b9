package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageEnqueue implements outbox.Enqueuer: it inserts p.Messages in a
// transaction of its own, commits, and wakes the Wakeups listeners. See
// MessageEnqueueTx.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return s.core.MessageEnqueue(ctx, p)
}

// MessageEnqueueTx implements outbox.Enqueuer[*sql.Tx]: it inserts
// p.Messages in the caller's transaction tx, so they exist if and only if
// tx commits. A repeated (Tenant, IdempotencyKey) inserts nothing, raises no
// error and returns the stored message with Existed = true; tx stays
// usable.
//
// The store cannot see when tx commits, so Wakeups is not signalled: use
// InTx, call Notify after the commit, or let the processor's poll pick the
// messages up.
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return s.core.MessageEnqueueTx(ctx, tx, p)
}

// MaxPayloadBytes implements outbox.PayloadLimiter: the largest payload the
// store holds (see the store's Options documentation).
func (s *Store) MaxPayloadBytes() int { return s.core.MaxPayloadBytes() }

// Insert inserts prepared messages with q (the caller's tx or the store's
// connection). A conflict on (tenant, idempotency_key) inserts nothing and
// reads the original back.
func (d *dialect) Insert(ctx context.Context, q sqlstore.Querier, msgs []outbox.Message) ([]outbox.Enqueued, error) {
	out := make([]outbox.Enqueued, 0, len(msgs))
	ins, err := q.PrepareContext(ctx, d.q.insert)
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
		stored, err := sqlstore.ScanMessage(ins.QueryRowContext(ctx,
			m.ID, m.Tenant, m.Topic, m.Group, m.IdempotencyKey, sqlstore.PayloadArg(&m), m.ContentType, headers,
			m.MaxAttempts, m.NextAttemptAt.UnixMicro(), m.CreatedAt.UnixMicro(), m.UpdatedAt.UnixMicro()))
		switch {
		case err == nil:
			out = append(out, outbox.Enqueued{Message: stored})
			continue
		case !sqlstore.IsNoRows(err):
			return nil, fmt.Errorf("sqlite: enqueue message %d: %w", i, err)
		}
		// Nothing inserted: a UNIQUE conflict, on the idempotency key (the
		// original is returned) or on the ID (another message has it).
		orig, err := sqlstore.Original(ctx, q, d.q.selectByKey, i, m)
		if err != nil {
			return nil, err
		}
		out = append(out, orig)
	}
	return out, nil
}
