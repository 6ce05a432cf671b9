package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet is the stores' MessageGet: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	m, err := s.byID(ctx, s.db, p.Tenant, p.ID, "")
	if err != nil {
		return outbox.Message{}, s.errorf("get "+p.ID, err)
	}
	return m, nil
}

// byID reads one message of a tenant, with lock appended to the query; an
// unknown ID is an error wrapping outbox.ErrNotFound.
func (s *Store) byID(ctx context.Context, q Querier, tenant, id, lock string) (outbox.Message, error) {
	m, err := ScanMessage(q.QueryRowContext(ctx, `SELECT `+MessageCols+` FROM `+s.messages+
		` WHERE tenant = ? AND id = ?`+lock, tenant, id))
	if IsNoRows(err) {
		return outbox.Message{}, NotFound(tenant, id)
	}
	return m, err
}

// MessageList is the stores' MessageList: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.list(ctx, s.db, p)
}

// MessageListTx is the stores' MessageListTx: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageListTx(ctx context.Context, tx *sql.Tx, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if tx == nil {
		return outbox.MessagePage{}, outbox.InvalidParam("tx", "is nil")
	}
	return s.list(ctx, tx, p)
}

func (s *Store) list(ctx context.Context, q Querier, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if err := p.Validate(); err != nil {
		return outbox.MessagePage{}, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	where := []string{"tenant = ?", "seq > ?"}
	args := []any{p.Tenant, p.AfterSeq}
	if p.Status != "" {
		where, args = append(where, "status = ?"), append(args, string(p.Status))
	}
	if p.Topic != "" {
		where, args = append(where, "topic = ?"), append(args, p.Topic)
	}
	if p.Group != "" {
		where, args = append(where, "grp = ?"), append(args, p.Group)
	}
	if p.BlocksGroup {
		where = append(where, "status = 'FAILED'", "blocks_group = 1")
	}
	args = append(args, limit+1)
	rows, err := q.QueryContext(ctx, `SELECT `+MessageCols+` FROM `+s.messages+
		` WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return outbox.MessagePage{}, s.errorf("list", err)
	}
	msgs, err := ScanMessages(rows)
	if err != nil {
		return outbox.MessagePage{}, s.errorf("list", err)
	}
	var page outbox.MessagePage
	if len(msgs) > limit {
		msgs = msgs[:limit]
		page.NextAfterSeq = msgs[limit-1].Seq
	}
	page.Messages = msgs
	return page, nil
}

// MessageCount is the stores' MessageCount: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	query := `SELECT status, COUNT(*) FROM ` + s.messages + ` WHERE tenant = ? GROUP BY status`
	args := []any{p.Tenant}
	if p.AllTenants {
		query, args = `SELECT status, COUNT(*) FROM `+s.messages+` GROUP BY status`, nil
	}
	out := make(map[outbox.Status]int64, len(outbox.Statuses()))
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	err := scanRows(ctx, s.db, query, args, func(rows *sql.Rows) error {
		var st string
		var n int64
		err := rows.Scan(&st, &n)
		out[outbox.Status(st)] = n
		return err
	})
	if err != nil {
		return nil, s.errorf("count", err)
	}
	return out, nil
}

// scanRows runs query and calls each for every row.
func scanRows(ctx context.Context, q Querier, query string, args []any, each func(*sql.Rows) error) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// AttemptList is the stores' AttemptList: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.messages+` WHERE tenant = ? AND id = ?`,
		p.Tenant, p.MessageID).Scan(&n); err != nil {
		return nil, s.errorf("attempts of "+p.MessageID, err)
	}
	if n == 0 {
		return nil, NotFound(p.Tenant, p.MessageID)
	}
	out := []outbox.Attempt{}
	err := scanRows(ctx, s.db, `SELECT `+AttemptCols+` FROM `+s.attempts+
		` WHERE tenant = ? AND message_id = ? ORDER BY id`, []any{p.Tenant, p.MessageID}, func(rows *sql.Rows) error {
		a, err := ScanAttempt(rows)
		out = append(out, a)
		return err
	})
	if err != nil {
		return nil, s.errorf("attempts of "+p.MessageID, err)
	}
	return out, nil
}

// transition moves one message of a tenant by ev, checked with
// outbox.Transition on the locked row, and applies set (an SQL SET list with
// its args) in the same transaction.
func (s *Store) transition(ctx context.Context, tenant, id string, ev outbox.Event, set string, args ...any) (outbox.Message, error) {
	var out outbox.Message
	err := s.dialect.WriteTx(ctx, func(q Querier) error {
		m, err := s.byID(ctx, q, tenant, id, s.syntax.ForUpdate)
		if err != nil {
			return err
		}
		if _, err := outbox.Transition(m.Status, ev); err != nil {
			return fmt.Errorf("message %s: %w", id, err)
		}
		a := append(append([]any{}, args...), m.Seq)
		if _, err := q.ExecContext(ctx, `UPDATE `+s.messages+` SET `+set+` WHERE seq = ?`, a...); err != nil {
			return err
		}
		out, err = s.byID(ctx, q, tenant, id, "")
		return err
	})
	if err != nil {
		return outbox.Message{}, s.errorf(string(ev), err)
	}
	s.Notify()
	return out, nil
}

// MessageRequeue is the stores' MessageRequeue: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	now := s.syntax.Time(s.now(p.Now))
	return s.transition(ctx, p.Tenant, p.ID, outbox.EventRequeue, requeueSet, now, now)
}

// requeueSet is what a requeue sets (MessageRequeue, MessageRequeueMany),
// with the due and update times as its two placeholders. The message
// starts over: no lease, and no provider ID or delivery times (a late
// receipt for the ID it had must not find it).
const requeueSet = `status = 'PENDING', attempts = 0, recoveries = 0, next_attempt_at = ?, updated_at = ?,
	claimed_at = NULL, claimed_by = NULL, claim_token = NULL, blocks_group = 0,
	provider_message_id = NULL, sent_at = NULL, delivered_at = NULL, read_at = NULL`

// MessageCancel is the stores' MessageCancel: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	return s.transition(ctx, p.Tenant, p.ID, outbox.EventCancel, `status = 'CANCELLED', updated_at = ?, blocks_group = 0`, s.syntax.Time(s.now(p.Now)))
}

// MessagePrune is the stores' MessagePrune: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	sts := p.PruneStatuses()
	where := `status IN (` + Placeholders(len(sts)) + `) AND updated_at < ? AND blocks_group = 0`
	args := make([]any, 0, len(sts)+3)
	for _, st := range sts {
		args = append(args, string(st))
	}
	args = append(args, s.syntax.Time(s.now(p.Before)))
	if p.Topic != "" {
		where += ` AND topic = ?`
		args = append(args, p.Topic)
	}
	if p.DryRun {
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.messages+` WHERE `+where, args...).Scan(&n); err != nil {
			return 0, s.errorf("prune: count", err)
		}
		return n, nil
	}
	var n int64
	err := s.dialect.WriteTx(ctx, func(q Querier) error {
		var ids []any
		err := scanRows(ctx, q, `SELECT id FROM `+s.messages+`
			WHERE `+where+`
			ORDER BY updated_at, seq LIMIT ?`+s.syntax.SkipLocked, append(args, limit), func(rows *sql.Rows) error {
			var id string
			err := rows.Scan(&id)
			ids = append(ids, id)
			return err
		})
		if err != nil || len(ids) == 0 {
			return err
		}
		in := Placeholders(len(ids))
		if _, err := q.ExecContext(ctx, `DELETE FROM `+s.attempts+` WHERE message_id IN (`+in+`)`, ids...); err != nil {
			return err
		}
		r, err := q.ExecContext(ctx, `DELETE FROM `+s.messages+` WHERE id IN (`+in+`)`, ids...)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.errorf("prune", err)
	}
	return int(n), nil
}

// MessageApplyReceipt is the stores' MessageApplyReceipt: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.ReceiptResult{}, err
	}
	r := p.Receipt
	r.At = s.now(r.At)
	var res outbox.ReceiptResult
	err := s.dialect.WriteTx(ctx, func(q Querier) error {
		m, err := ScanMessage(q.QueryRowContext(ctx, `SELECT `+MessageCols+` FROM `+s.messages+`
			WHERE tenant = ? AND provider_message_id = ? ORDER BY seq DESC LIMIT 1`+s.syntax.ForUpdate, r.Tenant, r.ProviderMessageID))
		if IsNoRows(err) {
			return fmt.Errorf("%w: provider message id %q in tenant %q", outbox.ErrNotFound, r.ProviderMessageID, r.Tenant)
		}
		if err != nil {
			return err
		}
		next, changed, err := outbox.ApplyReceipt(m, r)
		if err != nil {
			return err
		}
		res = outbox.ReceiptResult{Message: m, Changed: changed, Previous: m.Status}
		if !changed {
			return nil
		}
		var code, msg any
		if next.LastError != nil {
			code, msg = next.LastError.Code, next.LastError.Message
		}
		if _, err := q.ExecContext(ctx, `UPDATE `+s.messages+` SET status = ?, sent_at = ?,
			delivered_at = ?, read_at = ?, last_error_code = ?, last_error_message = ?, updated_at = ?
			WHERE seq = ?`,
			string(next.Status), s.syntax.NullTime(next.SentAt), s.syntax.NullTime(next.DeliveredAt), s.syntax.NullTime(next.ReadAt),
			code, msg, s.syntax.Time(s.now(s.clock.Now())), m.Seq); err != nil {
			return err
		}
		res.Message, err = s.byID(ctx, q, m.Tenant, m.ID, "")
		return err
	})
	if err != nil {
		return outbox.ReceiptResult{}, s.errorf("receipt", err)
	}
	return res, nil
}

// InboxPrune is the stores' InboxPrune: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) InboxPrune(ctx context.Context, p outbox.InboxPruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	var n int64
	err := s.dialect.WriteTx(ctx, func(q Querier) error {
		r, err := q.ExecContext(ctx, s.syntax.DeleteOldest(s.inbox, "handled_at"), s.syntax.Time(s.now(p.Before)), limit)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.errorf("inbox prune", err)
	}
	return int(n), nil
}

// DeadLetterBlocking is the stores' DeadLetterBlocking: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) DeadLetterBlocking() bool { return true }
