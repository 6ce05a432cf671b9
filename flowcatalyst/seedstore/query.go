package seedstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet returns one row by id (tenant must be "").
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.tables {
		if s.mg != nil {
			r, found, err := s.getMongo(ctx, t, p.ID)
			if err != nil {
				return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
			}
			if found {
				return s.message(&r, t.topic), nil
			}
			continue
		}
		rows, err := s.db.QueryContext(ctx, t.sql.get, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
		}
		var r row
		found := rows.Next()
		if found {
			err = rows.Scan(r.dest()...)
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
		}
		if found {
			return s.message(&r, t.topic), nil
		}
	}
	return outbox.Message{}, outbox.ErrNotFound
}

// Ping implements outbox.Pinger, the processor's start-up probe: on
// MongoDB the ping command (a one-document listing sorted by _id would read
// the whole collection on a server that sorts in memory, like FerretDB);
// on PostgreSQL and MySQL a one-row listing, which also finds missing
// tables.
func (s *Store) Ping(ctx context.Context) error {
	if s.mg != nil {
		if err := s.mg.db.RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err(); err != nil {
			return fmt.Errorf("seedstore: ping: %w", err)
		}
		return nil
	}
	_, err := s.MessageList(ctx, outbox.MessageListParams{Limit: 1})
	return err
}

// MessageList returns rows ordered by id (a TSID, so by creation), filtered
// by status, topic and group. Pagination (AfterSeq) works for TSID ids.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if err := p.Validate(); err != nil {
		return outbox.MessagePage{}, err
	}
	if p.Tenant != "" || p.BlocksGroup {
		return outbox.MessagePage{}, nil // no tenants, no blocking dead letters
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	if limit > 1000 {
		return outbox.MessagePage{}, outbox.InvalidParam("Limit", "must be at most 1000")
	}
	status := ""
	if p.Status != "" {
		var ok bool
		if status, ok = seedStatus(p.Status); !ok {
			return outbox.MessagePage{}, nil
		}
	}
	after := ""
	if p.AfterSeq > 0 {
		after = flowcatalyst.TSID(p.AfterSeq).String()
	}
	var all []outbox.Message
	for _, t := range s.tables {
		if p.Topic != "" && p.Topic != t.topic {
			continue
		}
		if s.mg != nil {
			rows, err := s.listMongo(ctx, t, after, status, p.Group, limit+1)
			if err != nil {
				return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
			}
			for i := range rows {
				all = append(all, s.message(&rows[i], t.topic))
			}
			continue
		}
		args := []any{after, status, p.Group, limit + 1}
		if s.mysql {
			// ? placeholders: each value as often as the statement uses it.
			args = []any{after, after, status, status, p.Group, p.Group, limit + 1}
		}
		rows, err := s.db.QueryContext(ctx, t.sql.list, args...)
		if err != nil {
			return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
		}
		for rows.Next() {
			var r row
			if err := rows.Scan(r.dest()...); err != nil {
				rows.Close()
				return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
			}
			all = append(all, s.message(&r, t.topic))
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	page := outbox.MessagePage{Messages: all}
	if len(all) > limit {
		page.Messages = all[:limit]
		page.NextAfterSeq = page.Messages[limit-1].Seq
	}
	return page, nil
}

func seedStatus(st outbox.Status) (string, bool) {
	switch st {
	case outbox.StatusPending:
		return StatusPending, true
	case outbox.StatusProcessing:
		return StatusProcessing, true
	case outbox.StatusSent:
		return StatusCompleted, true
	case outbox.StatusFailed:
		return StatusFailed, true
	}
	return "", false
}

// MessageCount counts rows of both tables by status (COMPLETED counts as
// SENT; every outbox status is present).
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	out := map[outbox.Status]int64{}
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	if p.Tenant != "" && !p.AllTenants {
		return out, nil
	}
	for _, t := range s.tables {
		if s.mg != nil {
			counts, err := s.countMongo(ctx, t)
			if err != nil {
				return nil, fmt.Errorf("seedstore: count: %w", err)
			}
			for st, n := range counts {
				r := row{status: st}
				out[s.message(&r, t.topic).Status] += n
			}
			continue
		}
		rows, err := s.db.QueryContext(ctx, t.sql.count)
		if err != nil {
			return nil, fmt.Errorf("seedstore: count: %w", err)
		}
		for rows.Next() {
			var st string
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return nil, fmt.Errorf("seedstore: count: %w", err)
			}
			r := row{status: st}
			out[s.message(&r, t.topic).Status] += n
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("seedstore: count: %w", err)
		}
	}
	return out, nil
}

// MessageRequeue moves a FAILED row back to PENDING, due now, with
// retry_count 0 and no error message.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.tables {
		if s.mg != nil {
			ok, err := s.requeueMongo(ctx, t, p.ID)
			if err != nil {
				return outbox.Message{}, fmt.Errorf("seedstore: requeue: %w", err)
			}
			if ok {
				return s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
			}
			continue
		}
		res, err := s.db.ExecContext(ctx, t.sql.requeue, p.ID)
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
	return outbox.Message{}, fmt.Errorf("seedstore: requeue %s: %w", m.Status, outbox.ErrInvalidTransition)
}

// MessagePrune deletes COMPLETED and FAILED rows finished before p.Before,
// at most p.Limit (default 1000) per table and call. It refuses
// p.Statuses, p.Topic and p.DryRun (outbox.ErrInvalidInput) rather than
// delete more than asked.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	if len(p.Statuses) > 0 || p.Topic != "" || p.DryRun {
		return 0, outbox.InvalidParam("MessagePruneParams", "the seed tables prune by age only (no Statuses, Topic or DryRun)")
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	total := 0
	for _, t := range s.tables {
		if s.mg != nil {
			n, err := s.pruneMongo(ctx, t, at(p.Before).Truncate(time.Millisecond), limit)
			total += n
			if err != nil {
				return total, fmt.Errorf("seedstore: prune: %w", err)
			}
			continue
		}
		res, err := s.db.ExecContext(ctx, t.sql.prune, at(p.Before), limit)
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

// MessageApplyReceipt returns outbox.ErrNotFound: FlowCatalyst sends no
// receipts and the seed tables have no provider message id.
func (s *Store) MessageApplyReceipt(context.Context, outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return outbox.ReceiptResult{}, outbox.ErrNotFound
}

// MessageCancel returns an error matching errors.ErrUnsupported: the seed
// has no CANCELLED status, and writing one would break the seed's readers.
func (s *Store) MessageCancel(context.Context, outbox.MessageCancelParams) (outbox.Message, error) {
	return outbox.Message{}, fmt.Errorf("seedstore: cancel: the seed tables have no CANCELLED status: %w", errors.ErrUnsupported)
}

var _ outbox.Store = (*Store)(nil)
