package mysql

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// Insert locks the ordered groups of msgs (in key order, so one batch never
// deadlocks with another) and inserts the messages: in multi-row
// statements when there are several and every ID was generated for this
// call (insertBatch), one by one otherwise. A message whose (tenant,
// idempotency_key) exists is read back.
//
// Enqueueing into an ordered group (Group != "") first locks the group's row
// in the groups table until the transaction ends: a second transaction
// enqueueing into the same group waits until the first commits or rolls
// back, which makes a group's commit order its sequence order (so a claimer
// never sees message n+1 of a group before message n).
func (d *dialect) Insert(ctx context.Context, q sqlstore.Querier, msgs []outbox.Message) ([]outbox.Enqueued, error) {
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
	// One statement per 1,000 groups: InnoDB takes the rows' locks in the
	// order of the VALUES list, so the key order holds.
	for len(groups) > 0 {
		chunk := groups[:min(len(groups), 1000)]
		groups = groups[len(chunk):]
		args := make([]any, 0, 3*len(chunk))
		for _, k := range chunk {
			args = append(args, k.Tenant, k.Topic, k.Grp)
		}
		if _, err := q.ExecContext(ctx, d.q.lockGroups(len(chunk)), args...); err != nil {
			return nil, fmt.Errorf("lock groups: %w", err)
		}
	}
	if len(msgs) > 1 && generatedIDs(msgs) {
		return d.insertBatch(ctx, q, msgs)
	}
	out := make([]outbox.Enqueued, 0, len(msgs))
	for i, m := range msgs {
		res, err := q.ExecContext(ctx, d.q.insert, insertArgs(nil, &m)...)
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
		orig, err := sqlstore.Original(ctx, q, d.q.selectByKey, i, m)
		if err != nil {
			return nil, err
		}
		out = append(out, orig)
	}
	return out, nil
}

// insertArgs appends to args the 12 values of m's row in q.insert.
func insertArgs(args []any, m *outbox.Message) []any {
	var headers any
	if len(m.Headers) > 0 {
		b, _ := json.Marshal(m.Headers) // checked by prepare
		headers = b
	}
	return append(args, m.ID, m.Tenant, m.Topic, m.Group, m.IdempotencyKey, sqlstore.PayloadArg(m), m.ContentType, headers,
		m.MaxAttempts, ts(m.NextAttemptAt), ts(m.CreatedAt), ts(m.UpdatedAt))
}

// generatedIDs reports that every message of msgs has an ID generated for
// this call (outbox.Message.IDGenerated): no stored message can have it, so
// a message that inserts nothing repeats a stored (tenant, key).
func generatedIDs(msgs []outbox.Message) bool {
	for i := range msgs {
		if !msgs[i].IDGenerated() {
			return false
		}
	}
	return true
}

// Batches of insertBatch: at most batchRows rows (12 parameters each, under
// the protocol's 65,535 per statement) and about batchBytes of payload
// (max_allowed_packet is 16 MiB on MariaDB, 64 MiB on MySQL 8 by default);
// a larger message goes alone.
const (
	batchRows  = 1000
	batchBytes = 4 << 20
)

// insertBatch inserts msgs, whose IDs were all generated for this call, in
// multi-row statements (in order, so a group's messages get increasing
// seqs in the call's order), then reads the seqs of the rows it inserted
// by ID: InnoDB's interleaved auto-increment mode (MySQL 8's default) does
// not promise consecutive values within a statement. A message whose ID is
// not found inserted nothing: its (tenant, idempotency_key) is stored, or
// repeats an earlier message of the call, and the original is read back.
func (d *dialect) insertBatch(ctx context.Context, q sqlstore.Querier, msgs []outbox.Message) ([]outbox.Enqueued, error) {
	out := make([]outbox.Enqueued, len(msgs))
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < batchRows && (end == start || size+len(msgs[end].Payload) <= batchBytes) {
			size += len(msgs[end].Payload)
			end++
		}
		chunk := msgs[start:end]
		args := make([]any, 0, 12*len(chunk))
		ids := make([]any, len(chunk))
		for i := range chunk {
			args = insertArgs(args, &chunk[i])
			ids[i] = chunk[i].ID
		}
		if _, err := q.ExecContext(ctx, d.q.insertRows(len(chunk)), args...); err != nil {
			return nil, fmt.Errorf("messages %d-%d: %w", start, end-1, err)
		}
		// A row found by ID is this call's only with the message's tenant
		// and key: a stored message with the same ID (a generated ID
		// colliding, which no generator run should produce) is not.
		type stored struct {
			seq         int64
			tenant, key string
		}
		seqs := make(map[string]stored, len(chunk))
		rows, err := q.QueryContext(ctx, `SELECT id, seq, tenant, idempotency_key FROM `+d.q.messages+` WHERE id IN (`+sqlstore.Placeholders(len(ids))+`)`, ids...)
		if err != nil {
			return nil, fmt.Errorf("messages %d-%d: read seqs: %w", start, end-1, err)
		}
		for rows.Next() {
			var id string
			var r stored
			if err := rows.Scan(&id, &r.seq, &r.tenant, &r.key); err != nil {
				rows.Close()
				return nil, fmt.Errorf("messages %d-%d: read seqs: %w", start, end-1, err)
			}
			seqs[id] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("messages %d-%d: read seqs: %w", start, end-1, err)
		}
		for i, m := range chunk {
			if r, ok := seqs[m.ID]; ok && r.tenant == m.Tenant && r.key == m.IdempotencyKey {
				m.Seq = r.seq
				out[start+i] = outbox.Enqueued{Message: m}
				continue
			}
			orig, err := sqlstore.Original(ctx, q, d.q.selectByKey, start+i, m)
			if err != nil {
				return nil, err
			}
			out[start+i] = orig
		}
		start = end
	}
	return out, nil
}
