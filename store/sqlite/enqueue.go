package sqlite

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

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
