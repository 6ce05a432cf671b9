package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet returns one message of a tenant, or an error matching
// outbox.ErrNotFound.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	m, err := scanMessage(s.db.QueryRow(ctx, s.reads().get, text(p.Tenant), text(p.ID)))
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.Message{}, fmt.Errorf("%w: %s", outbox.ErrNotFound, p.ID)
	}
	if err != nil {
		return outbox.Message{}, wrapErr("get", err)
	}
	return m, nil
}

// MessageList returns a page of a tenant's messages in Seq order.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.list(ctx, s.db, p)
}

// MessageListTx is MessageList inside the caller's transaction tx, so it
// sees what tx enqueued before it commits (outboxtest.RequireEnqueuedTx uses
// it).
func (s *Store) MessageListTx(ctx context.Context, tx pgx.Tx, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if tx == nil {
		return outbox.MessagePage{}, outbox.InvalidParam("tx", "is nil")
	}
	return s.list(ctx, tx, p)
}

// querier is what DB and pgx.Tx offer for reading.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (s *Store) list(ctx context.Context, q querier, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if err := p.Validate(); err != nil {
		return outbox.MessagePage{}, err
	}
	limit := p.Limit
	switch {
	case limit <= 0:
		limit = 100
	case limit > 1000:
		limit = 1000
	}
	r, err := q.Query(ctx, s.reads().list, text(p.Tenant), p.AfterSeq, string(p.Status), text(p.Topic), text(p.Group), limit+1, p.BlocksGroup)
	if err != nil {
		return outbox.MessagePage{}, wrapErr("list", err)
	}
	defer r.Close()
	var page outbox.MessagePage
	for r.Next() {
		m, err := scanMessage(r)
		if err != nil {
			return outbox.MessagePage{}, wrapErr("list", err)
		}
		page.Messages = append(page.Messages, m)
	}
	if err := r.Err(); err != nil {
		return outbox.MessagePage{}, wrapErr("list", err)
	}
	if len(page.Messages) > limit {
		page.Messages = page.Messages[:limit]
		page.NextAfterSeq = page.Messages[limit-1].Seq
	}
	return page, nil
}

// MessageCount counts a tenant's messages (or everyone's, with AllTenants)
// by status; every status is in the map.
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	var (
		r   pgx.Rows
		err error
	)
	if p.AllTenants {
		r, err = s.db.Query(ctx, s.reads().countAll)
	} else {
		r, err = s.db.Query(ctx, s.reads().count, text(p.Tenant))
	}
	if err != nil {
		return nil, wrapErr("count", err)
	}
	defer r.Close()
	out := make(map[outbox.Status]int64, 6)
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	for r.Next() {
		var st string
		var n int64
		if err := r.Scan(&st, &n); err != nil {
			return nil, wrapErr("count", err)
		}
		out[outbox.Status(st)] = n
	}
	if err := r.Err(); err != nil {
		return nil, wrapErr("count", err)
	}
	return out, nil
}

// AttemptList returns the attempts of a tenant's message, oldest first
// (none for an unknown message).
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	r, err := s.db.Query(ctx, s.reads().attempts, text(p.Tenant), text(p.MessageID))
	if err != nil {
		return nil, wrapErr("attempts", err)
	}
	defer r.Close()
	var out []outbox.Attempt
	for r.Next() {
		var (
			a                     outbox.Attempt
			outcome               string
			code, msg             *string
			resp                  []byte
			next, started, finish *time.Time
		)
		if err := r.Scan(&a.MessageID, &a.Tenant, &a.Number, &outcome, &code, &msg, &resp, &next, &started, &finish); err != nil {
			return nil, wrapErr("attempts", err)
		}
		a.Outcome = outbox.AttemptOutcome(outcome)
		if code != nil || msg != nil {
			a.Error = &outbox.ErrorInfo{Code: deref(code), Message: deref(msg)}
		}
		if len(resp) > 0 {
			a.ProviderResponse = resp
		}
		a.NextAttemptAt, a.StartedAt, a.FinishedAt = derefTime(next), derefTime(started), derefTime(finish)
		out = append(out, a)
	}
	if err := r.Err(); err != nil {
		return nil, wrapErr("attempts", err)
	}
	return out, nil
}

// MessageCancel moves a PENDING message or a dead letter (FAILED) to
// CANCELLED, and wakes the processors (a dead letter that blocked its group
// releases it). A message in another status returns an error wrapping
// outbox.ErrInvalidTransition; an unknown one, outbox.ErrNotFound.
func (s *Store) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	channel := s.channel
	if s.opts.DisableNotify {
		channel = ""
	}
	var m outbox.Message
	var err error
	if s.logMode {
		err = s.logOperate(ctx, []string{text(p.ID)}, s.at(p.Now), func(tx pgx.Tx) error {
			m, err = scanMessage(tx.QueryRow(ctx, s.lsql.cancel, text(p.Tenant), text(p.ID), s.at(p.Now), channel))
			return err
		})
	} else {
		m, err = scanMessage(s.db.QueryRow(ctx, s.sql.cancel, text(p.Tenant), text(p.ID), s.at(p.Now), channel))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.Message{}, s.transitionErr(ctx, p.Tenant, p.ID, outbox.EventCancel)
	}
	if err != nil {
		return outbox.Message{}, wrapErr("cancel", err)
	}
	return m, nil
}

// MessageRequeue moves a FAILED message back to PENDING, due at p.Now, with
// its attempts reset and its provider fields cleared, and wakes the
// processors. Other statuses return an error wrapping
// outbox.ErrInvalidTransition.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	channel := s.channel
	if s.opts.DisableNotify {
		channel = ""
	}
	var m outbox.Message
	var err error
	if s.logMode {
		err = s.logOperate(ctx, []string{text(p.ID)}, s.at(p.Now), func(tx pgx.Tx) error {
			m, err = scanMessage(tx.QueryRow(ctx, s.lsql.requeue, text(p.Tenant), text(p.ID), s.at(p.Now), channel, s.groupNS))
			return err
		})
	} else {
		m, err = scanMessage(s.db.QueryRow(ctx, s.sql.requeue, text(p.Tenant), text(p.ID), s.at(p.Now), channel, s.groupNS))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.Message{}, s.transitionErr(ctx, p.Tenant, p.ID, outbox.EventRequeue)
	}
	if err != nil {
		return outbox.Message{}, wrapErr("requeue", err)
	}
	return m, nil
}

// transitionErr explains why a conditional update touched no row.
func (s *Store) transitionErr(ctx context.Context, tenant, id string, ev outbox.Event) error {
	var st string
	err := s.db.QueryRow(ctx, s.reads().statusOf, text(tenant), text(id)).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s", outbox.ErrNotFound, id)
	}
	if err != nil {
		return wrapErr(string(ev), err)
	}
	_, terr := outbox.Transition(outbox.Status(st), ev)
	if terr == nil { // raced with another change; report it as refused
		terr = fmt.Errorf("%w: %s on %s (changed concurrently)", outbox.ErrInvalidTransition, ev, st)
	}
	return terr
}

// MessageApplyReceipt applies a provider receipt to the tenant's message
// with that provider message ID (the newest, if several), with
// outbox.ApplyReceipt's rule: idempotent, never backwards. It locks the row
// for the read-modify-write, so concurrent receipts for one message apply
// one after the other.
func (s *Store) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	rc := p.Receipt
	if rc.ProviderMessageID == "" {
		return outbox.ReceiptResult{}, outbox.InvalidParam("ProviderMessageID", "is required")
	}
	if _, err := rc.Status.Event(); err != nil {
		return outbox.ReceiptResult{}, err
	}
	rc.At = s.at(rc.At)
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return outbox.ReceiptResult{}, wrapErr("receipt: begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	m, err := scanMessage(tx.QueryRow(ctx, s.sql.receiptLock, text(rc.Tenant), text(rc.ProviderMessageID)))
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.ReceiptResult{}, fmt.Errorf("%w: provider message %s", outbox.ErrNotFound, rc.ProviderMessageID)
	}
	if err != nil {
		return outbox.ReceiptResult{}, wrapErr("receipt", err)
	}
	prev := m.Status
	next, changed, err := outbox.ApplyReceipt(m, rc)
	if err != nil {
		return outbox.ReceiptResult{}, err
	}
	if !changed {
		return outbox.ReceiptResult{Message: m, Previous: prev}, nil
	}
	next.UpdatedAt = next.UpdatedAt.UTC().Truncate(time.Microsecond)
	var code, msg *string
	if next.LastError != nil {
		code, msg = nullText(next.LastError.Code), nullText(next.LastError.Message)
		next.LastError = &outbox.ErrorInfo{Code: deref(code), Message: deref(msg)}
	}
	if _, err := tx.Exec(ctx, s.sql.receiptUpdate, next.ID, string(next.Status),
		nullTime(next.SentAt), nullTime(next.DeliveredAt), nullTime(next.ReadAt), code, msg, next.UpdatedAt); err != nil {
		return outbox.ReceiptResult{}, wrapErr("receipt", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return outbox.ReceiptResult{}, wrapErr("receipt: commit", err)
	}
	return outbox.ReceiptResult{Message: next, Changed: true, Previous: prev}, nil
}

// MessagePrune deletes up to p.Limit (default 1,000) finished messages
// (SENT, DELIVERED, FAILED, CANCELLED, or p.Statuses; of p.Topic when set)
// last updated before p.Before, with their attempts, in one short
// statement that skips rows locked by others; p.DryRun counts them instead.
// Call it in a loop until it returns less than the limit. Every 50,000
// pruned rows, the store analyses its tables (ANALYZE, best effort).
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	sts := make([]string, 0, 4)
	for _, st := range p.PruneStatuses() {
		sts = append(sts, string(st))
	}
	before := p.Before.UTC().Truncate(time.Microsecond)
	var n int
	if p.DryRun {
		if err := s.db.QueryRow(ctx, s.reads().pruneCount, before, sts, p.Topic).Scan(&n); err != nil {
			return 0, wrapErr("prune: count", err)
		}
		return n, nil
	}
	var err error
	if s.logMode {
		n, err = s.logPrune(ctx, before, limit, sts, p.Topic)
	} else {
		err = s.db.QueryRow(ctx, s.sql.prune, before, limit, sts, p.Topic).Scan(&n)
	}
	if err != nil {
		return 0, wrapErr("prune", err)
	}
	// After a large prune the statistics describe a table that is gone.
	if s.pruned.Add(int64(n)) >= analyzeAfterPrune {
		s.pruned.Store(0)
		s.analyze(ctx)
	}
	return n, nil
}

// DeadLetterBlocking implements outbox.DeadLetterBlocker: a dead letter
// recorded with BlockGroup holds its group (column blocks_group, covered by
// the group index the claim reads).
func (s *Store) DeadLetterBlocking() bool { return true }
