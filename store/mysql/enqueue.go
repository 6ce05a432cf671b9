package mysql

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// insert locks the ordered groups of msgs (in key order, so one batch never
// deadlocks with another) and inserts the messages one by one. A message
// whose (tenant, idempotency_key) exists is read back.
//
// Enqueueing into an ordered group (Group != "") first locks the group's row
// in the groups table until the transaction ends: a second transaction
// enqueueing into the same group waits until the first commits or rolls
// back, which makes a group's commit order its sequence order (so a claimer
// never sees message n+1 of a group before message n).
func (s *Store) insert(ctx context.Context, q sqlstore.Querier, msgs []outbox.Message) ([]outbox.Enqueued, error) {
	var groups []sqlstore.GroupKey
	seen := map[sqlstore.GroupKey]bool{}
	for i := range msgs {
		if msgs[i].Group == "" {
			continue
		}
		k := sqlstore.GroupKey{Tenant: msgs[i].Tenant, Topic: msgs[i].Topic, Grp: msgs[i].Group}
		if !seen[k] {
			seen[k] = true
			groups = append(groups, k)
		}
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Less(groups[j]) })
	for _, k := range groups {
		if _, err := q.ExecContext(ctx, s.q.lockGroup, k.Tenant, k.Topic, k.Grp); err != nil {
			return nil, fmt.Errorf("lock group %q: %w", k.Grp, err)
		}
	}
	out := make([]outbox.Enqueued, 0, len(msgs))
	for i, m := range msgs {
		var headers any
		if len(m.Headers) > 0 {
			b, _ := json.Marshal(m.Headers) // checked by prepare
			headers = b
		}
		res, err := q.ExecContext(ctx, s.q.insert,
			m.ID, m.Tenant, m.Topic, m.Group, m.IdempotencyKey, sqlstore.PayloadArg(&m), m.ContentType, headers,
			m.MaxAttempts, ts(m.NextAttemptAt), ts(m.CreatedAt), ts(m.UpdatedAt))
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		seq, err := res.LastInsertId()
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		// Inserted: one row affected and a new seq. (A duplicate affects 0
		// rows, or 1 with the DSN's clientFoundRows, and has no insert ID.)
		if n == 1 && seq > 0 {
			m.Seq = seq
			out = append(out, outbox.Enqueued{Message: m})
			continue
		}
		// Nothing inserted: the (tenant, key) exists (the original is
		// returned), or the ID is used by another message.
		orig, err := sqlstore.Original(ctx, q, s.q.selectByKey, i, m)
		if err != nil {
			return nil, err
		}
		out = append(out, orig)
	}
	return out, nil
}
