package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet implements outbox.Store: the message with p.ID in p.Tenant, or
// an error wrapping outbox.ErrNotFound.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if p.ID == "" {
		return outbox.Message{}, outbox.InvalidParam("ID", "is required")
	}
	m, err := scanMessage(s.db.QueryRowContext(ctx, s.q.selectByID, p.Tenant, p.ID))
	if isNoRows(err) {
		return outbox.Message{}, notFound(p.Tenant, p.ID)
	}
	if err != nil {
		return outbox.Message{}, fmt.Errorf("mysql: get %s: %w", p.ID, err)
	}
	return m, nil
}

// MessageList implements outbox.Store: a page of p.Tenant's messages in Seq
// order, optionally filtered by status, topic and group, starting after
// p.AfterSeq. Limit defaults to 100 and is capped at 1000.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.list(ctx, s.db, p)
}

// MessageListTx is MessageList inside the caller's transaction tx, so it
// sees what tx enqueued before it commits (outboxtest.RequireEnqueuedTx uses
// it).
func (s *Store) MessageListTx(ctx context.Context, tx *sql.Tx, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if tx == nil {
		return outbox.MessagePage{}, outbox.InvalidParam("tx", "is nil")
	}
	return s.list(ctx, tx, p)
}

func (s *Store) list(ctx context.Context, q querier, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if p.Status != "" && !p.Status.Valid() {
		return outbox.MessagePage{}, outbox.InvalidParam("Status", fmt.Sprintf("%q is not a status", p.Status))
	}
	if p.Limit < 0 {
		return outbox.MessagePage{}, outbox.InvalidParam("Limit", "must not be negative")
	}
	if p.AfterSeq < 0 {
		return outbox.MessagePage{}, outbox.InvalidParam("AfterSeq", "must not be negative")
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
	args = append(args, limit+1)
	rows, err := q.QueryContext(ctx, `SELECT `+messageCols+` FROM `+s.q.messages+
		` WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return outbox.MessagePage{}, fmt.Errorf("mysql: list: %w", err)
	}
	msgs, err := scanMessages(rows)
	if err != nil {
		return outbox.MessagePage{}, fmt.Errorf("mysql: list: %w", err)
	}
	var page outbox.MessagePage
	if len(msgs) > limit {
		msgs = msgs[:limit]
		page.NextAfterSeq = msgs[limit-1].Seq
	}
	page.Messages = msgs
	return page, nil
}

// MessageCount implements outbox.Store: p.Tenant's messages (every tenant's
// with p.AllTenants) counted by status; every status is present in the map.
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	query := `SELECT status, COUNT(*) FROM ` + s.q.messages + ` WHERE tenant = ? GROUP BY status`
	args := []any{p.Tenant}
	if p.AllTenants {
		query, args = `SELECT status, COUNT(*) FROM `+s.q.messages+` GROUP BY status`, nil
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("mysql: count: %w", err)
	}
	defer rows.Close()
	out := make(map[outbox.Status]int64, len(outbox.Statuses()))
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("mysql: count: %w", err)
		}
		out[outbox.Status(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysql: count: %w", err)
	}
	return out, nil
}

// AttemptList implements outbox.Store: the attempts of message p.MessageID in
// p.Tenant, oldest first. A message that does not exist in the tenant
// returns an error wrapping outbox.ErrNotFound.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if p.MessageID == "" {
		return nil, outbox.InvalidParam("MessageID", "is required")
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.q.messages+` WHERE tenant = ? AND id = ?`,
		p.Tenant, p.MessageID).Scan(&n); err != nil {
		return nil, fmt.Errorf("mysql: attempts of %s: %w", p.MessageID, err)
	}
	if n == 0 {
		return nil, notFound(p.Tenant, p.MessageID)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+attemptCols+` FROM `+s.q.attempts+
		` WHERE tenant = ? AND message_id = ? ORDER BY id`, p.Tenant, p.MessageID)
	if err != nil {
		return nil, fmt.Errorf("mysql: attempts of %s: %w", p.MessageID, err)
	}
	defer rows.Close()
	out := []outbox.Attempt{}
	for rows.Next() {
		a, err := scanAttempt(rows)
		if err != nil {
			return nil, fmt.Errorf("mysql: attempts of %s: %w", p.MessageID, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysql: attempts of %s: %w", p.MessageID, err)
	}
	return out, nil
}

// transition moves one message of a tenant by ev, checked with
// outbox.Transition on the locked row, and applies set (an SQL SET list with
// its args) in the same transaction.
func (s *Store) transition(ctx context.Context, tenant, id string, ev outbox.Event, set string, args ...any) (outbox.Message, error) {
	if id == "" {
		return outbox.Message{}, outbox.InvalidParam("ID", "is required")
	}
	var out outbox.Message
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		m, err := scanMessage(tx.QueryRowContext(ctx, s.q.selectByID+` FOR UPDATE`, tenant, id))
		if isNoRows(err) {
			return notFound(tenant, id)
		}
		if err != nil {
			return err
		}
		if _, err := outbox.Transition(m.Status, ev); err != nil {
			return fmt.Errorf("message %s: %w", id, err)
		}
		a := append(append([]any{}, args...), m.Seq)
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.q.messages+` SET `+set+` WHERE seq = ?`, a...); err != nil {
			return err
		}
		out, err = scanMessage(tx.QueryRowContext(ctx, s.q.selectByID, tenant, id))
		return err
	})
	if err != nil {
		return outbox.Message{}, fmt.Errorf("mysql: %s: %w", ev, err)
	}
	s.Notify()
	return out, nil
}

// MessageRequeue implements outbox.Store: a FAILED message goes back to
// PENDING, due now, with its attempts reset to 0 (its attempt history is
// kept). Other statuses return an error wrapping
// outbox.ErrInvalidTransition; an unknown ID one wrapping outbox.ErrNotFound.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	now := ts(s.now(p.Now))
	return s.transition(ctx, p.Tenant, p.ID, outbox.EventRequeue,
		`status = 'PENDING', attempts = 0, next_attempt_at = ?, updated_at = ?, claimed_at = NULL, claimed_by = NULL`,
		now, now)
}

// MessageCancel implements outbox.Store: a PENDING message becomes
// CANCELLED. Other statuses return an error wrapping
// outbox.ErrInvalidTransition; an unknown ID one wrapping outbox.ErrNotFound.
func (s *Store) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	now := ts(s.now(p.Now))
	return s.transition(ctx, p.Tenant, p.ID, outbox.EventCancel, `status = 'CANCELLED', updated_at = ?`, now)
}

// MessagePrune implements outbox.Store: it deletes up to p.Limit (default
// 1000) finished messages (SENT, DELIVERED, FAILED, CANCELLED) last updated
// before p.Before, oldest first, with their attempts, across all tenants.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	if p.Before.IsZero() {
		return 0, outbox.InvalidParam("Before", "is required")
	}
	if p.Limit < 0 {
		return 0, outbox.InvalidParam("Limit", "must not be negative")
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	before := ts(s.now(p.Before))
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id FROM `+s.q.messages+`
			WHERE status IN ('SENT', 'DELIVERED', 'FAILED', 'CANCELLED') AND updated_at < ?
			ORDER BY updated_at, seq LIMIT ? FOR UPDATE SKIP LOCKED`, before, limit)
		if err != nil {
			return err
		}
		var ids []any
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		in := placeholders(len(ids))
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+s.q.attempts+` WHERE message_id IN (`+in+`)`, ids...); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, `DELETE FROM `+s.q.messages+` WHERE id IN (`+in+`)`, ids...)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mysql: prune: %w", err)
	}
	return int(n), nil
}

// MessageApplyReceipt implements outbox.Store: it finds the message with the
// receipt's provider message ID in the receipt's tenant (else an error
// wrapping outbox.ErrNotFound), applies outbox.ApplyReceipt on the locked
// row, and writes the result back when it changed. Receipts are idempotent
// and never move a message backwards. A receipt without At is stamped with
// the store's clock.
func (s *Store) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	r := p.Receipt
	if r.ProviderMessageID == "" {
		return outbox.ReceiptResult{}, outbox.InvalidParam("Receipt.ProviderMessageID", "is required")
	}
	if _, err := r.Status.Event(); err != nil {
		return outbox.ReceiptResult{}, err
	}
	r.At = s.now(r.At)
	var res outbox.ReceiptResult
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		m, err := scanMessage(tx.QueryRowContext(ctx, `SELECT `+messageCols+` FROM `+s.q.messages+`
			WHERE tenant = ? AND provider_message_id = ? ORDER BY seq DESC LIMIT 1 FOR UPDATE`, r.Tenant, r.ProviderMessageID))
		if isNoRows(err) {
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
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.q.messages+` SET status = ?, sent_at = ?,
			delivered_at = ?, read_at = ?, last_error_code = ?, last_error_message = ?, updated_at = ?
			WHERE seq = ?`,
			string(next.Status), nts(next.SentAt), nts(next.DeliveredAt), nts(next.ReadAt), code, msg,
			ts(s.now(s.clock.Now())), m.Seq); err != nil {
			return err
		}
		res.Message, err = scanMessage(tx.QueryRowContext(ctx, `SELECT `+messageCols+` FROM `+s.q.messages+` WHERE seq = ?`, m.Seq))
		return err
	})
	if err != nil {
		return outbox.ReceiptResult{}, fmt.Errorf("mysql: receipt: %w", err)
	}
	return res, nil
}
