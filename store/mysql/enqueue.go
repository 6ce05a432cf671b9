package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageEnqueue implements outbox.Enqueuer: it inserts p.Messages in a
// transaction of its own, commits, and wakes the Wakeups listeners. See
// MessageEnqueueTx.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	var out []outbox.Enqueued
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = s.insert(ctx, tx, msgs)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mysql: enqueue: %w", err)
	}
	s.Notify()
	return out, nil
}

// MessageEnqueueTx implements outbox.Enqueuer[*sql.Tx]: it inserts
// p.Messages in the caller's transaction tx, so they exist if and only if
// tx commits. Invalid messages are refused with an error matching
// outbox.ErrInvalidInput before any statement runs. A repeated (Tenant,
// IdempotencyKey) inserts nothing (INSERT ... ON DUPLICATE KEY UPDATE, which
// raises no error) and returns the stored message with Existed = true. In
// both cases tx stays usable.
//
// Enqueueing into an ordered group (Group != "") first locks the group's row
// in the groups table until tx ends: a second transaction enqueueing into
// the same group waits until the first commits or rolls back, which makes a
// group's commit order its sequence order (so a claimer never sees message
// n+1 of a group before message n). Keep transactions short after
// enqueueing into a group. One call locks its groups in key order; when one
// transaction enqueues into several groups in several calls, do it in a
// consistent order, or the server may break a deadlock by rolling back one
// of the transactions.
//
// The store cannot see when tx commits, so Wakeups is not signalled: use
// InTx, call Notify after the commit, or let the processor's poll pick the
// messages up.
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	out, err := s.insert(ctx, tx, msgs)
	if err != nil {
		return nil, fmt.Errorf("mysql: enqueue: %w", err)
	}
	return out, nil
}

// prepare validates and completes copies of the messages (outbox.Outbox
// already did; a direct caller may not have).
func (s *Store) prepare(p outbox.MessageEnqueueParams) ([]outbox.Message, error) {
	now := s.now(p.Now)
	out := make([]outbox.Message, len(p.Messages))
	for i := range p.Messages {
		m := p.Messages[i]
		if err := outbox.PrepareMessage(&m, now); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		m.NextAttemptAt = m.NextAttemptAt.UTC().Truncate(time.Microsecond)
		if len(m.Headers) > 0 {
			if _, err := json.Marshal(m.Headers); err != nil {
				return nil, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("Headers", err.Error()))
			}
		}
		out[i] = m
	}
	return out, nil
}

type groupKey struct{ tenant, topic, grp string }

func (a groupKey) less(b groupKey) bool {
	if a.tenant != b.tenant {
		return a.tenant < b.tenant
	}
	if a.topic != b.topic {
		return a.topic < b.topic
	}
	return a.grp < b.grp
}

// insert locks the ordered groups of msgs (in key order, so one batch never
// deadlocks with another) and inserts the messages one by one. A message
// whose (tenant, idempotency_key) exists is read back.
func (s *Store) insert(ctx context.Context, q querier, msgs []outbox.Message) ([]outbox.Enqueued, error) {
	var groups []groupKey
	seen := map[groupKey]bool{}
	for i := range msgs {
		if msgs[i].Group == "" {
			continue
		}
		k := groupKey{msgs[i].Tenant, msgs[i].Topic, msgs[i].Group}
		if !seen[k] {
			seen[k] = true
			groups = append(groups, k)
		}
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].less(groups[j]) })
	for _, k := range groups {
		if _, err := q.ExecContext(ctx, s.q.lockGroup, k.tenant, k.topic, k.grp); err != nil {
			return nil, fmt.Errorf("lock group %q: %w", k.grp, err)
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
			m.ID, m.Tenant, m.Topic, m.Group, m.IdempotencyKey, []byte(m.Payload), headers,
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
		stored, err := scanMessage(q.QueryRowContext(ctx, s.q.selectByKey, m.Tenant, m.IdempotencyKey))
		if isNoRows(err) {
			return nil, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("ID", fmt.Sprintf("%q is already used by another message", m.ID)))
		}
		if err != nil {
			return nil, fmt.Errorf("message %d: read the original: %w", i, err)
		}
		out = append(out, outbox.Enqueued{Message: stored, Existed: true})
	}
	return out, nil
}
