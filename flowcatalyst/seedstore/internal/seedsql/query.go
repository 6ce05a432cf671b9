package seedsql

import (
	"context"
	"fmt"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet returns one row by id (tenant must be ""), looking in the
// events table first.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.Tables {
		r, found, err := s.get(ctx, t, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
		}
		if found {
			return s.Core.Message(&r, t.Topic), nil
		}
	}
	return outbox.Message{}, outbox.ErrNotFound
}

// get returns the row of t with id, or false.
func (s *Store) get(ctx context.Context, t *Table, id string) (seedcore.Row, bool, error) {
	rows, err := s.DB.QueryContext(ctx, t.Get, id)
	if err != nil {
		return seedcore.Row{}, false, err
	}
	defer rows.Close()
	var r seedcore.Row
	if !rows.Next() {
		return r, false, rows.Err()
	}
	if err := rows.Scan(r.Dest()...); err != nil {
		return r, false, err
	}
	return r, true, rows.Err()
}

// Ping implements outbox.Pinger, the processor's start-up probe: a
// one-row listing, which also finds missing tables.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.MessageList(ctx, outbox.MessageListParams{Limit: 1})
	return err
}

// MessageList returns rows ordered by id (a TSID, so by creation), filtered
// by status, topic and group. Pagination (AfterSeq) works for TSID ids.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	q, ok, err := seedcore.BeginList(p)
	if err != nil || !ok {
		return outbox.MessagePage{}, err
	}
	var all []outbox.Message
	for _, t := range s.Tables {
		if q.Topic != "" && q.Topic != t.Topic {
			continue
		}
		if all, err = s.list(ctx, t, q, all); err != nil {
			return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
		}
	}
	return q.Page(all), nil
}

// list appends t's rows matching q to all.
func (s *Store) list(ctx context.Context, t *Table, q seedcore.List, all []outbox.Message) ([]outbox.Message, error) {
	args := []any{q.After, q.Status, q.Group, q.Limit + 1}
	if s.d.RepeatListArgs {
		args = []any{q.After, q.After, q.Status, q.Status, q.Group, q.Group, q.Limit + 1}
	}
	rows, err := s.DB.QueryContext(ctx, t.List, args...)
	if err != nil {
		return all, err
	}
	defer rows.Close()
	for rows.Next() {
		var r seedcore.Row
		if err := rows.Scan(r.Dest()...); err != nil {
			return all, err
		}
		all = append(all, s.Core.Message(&r, t.Topic))
	}
	return all, rows.Err()
}

// MessageCount counts rows of both tables by status (COMPLETED counts as
// SENT; every outbox status is present).
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	out := seedcore.NewCounts()
	if p.Tenant != "" && !p.AllTenants {
		return out, nil
	}
	for _, t := range s.Tables {
		if err := s.count(ctx, t, out); err != nil {
			return nil, fmt.Errorf("seedstore: count: %w", err)
		}
	}
	return out, nil
}

// count adds t's rows by status to out.
func (s *Store) count(ctx context.Context, t *Table, out map[outbox.Status]int64) error {
	rows, err := s.DB.QueryContext(ctx, t.Count)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return err
		}
		out[seedcore.OutboxStatus(st)] += n
	}
	return rows.Err()
}

// MessageRequeue moves a FAILED row back to PENDING, due now, with
// retry_count 0 and no error message.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.Tables {
		res, err := s.DB.ExecContext(ctx, t.Requeue, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: requeue: %w", err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			return s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
		}
	}
	m, err := s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
	if err != nil {
		return outbox.Message{}, err
	}
	return outbox.Message{}, seedcore.RequeueRefused(m)
}

// MessagePrune deletes COMPLETED and FAILED rows finished before p.Before,
// at most p.Limit (default 1000) per table and call. It refuses
// p.Statuses, p.Topic and p.DryRun (outbox.ErrInvalidInput) rather than
// delete more than asked.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	limit, err := seedcore.PruneLimit(p)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, t := range s.Tables {
		res, err := s.DB.ExecContext(ctx, t.Prune, seedcore.At(p.Before), limit)
		if err != nil {
			return total, fmt.Errorf("seedstore: prune: %w", err)
		}
		n, _ := res.RowsAffected()
		total += int(n)
	}
	return total, nil
}

// AttemptList returns no attempts: the seed tables keep none. It returns
// outbox.ErrNotFound when the row does not exist.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if _, err := s.MessageGet(ctx, outbox.MessageGetParams{Tenant: p.Tenant, ID: p.MessageID}); err != nil {
		return nil, err
	}
	return nil, nil
}
