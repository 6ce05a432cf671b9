package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// getSQL reads one message by (tenant, ID).
const getSQL = `SELECT {COLS} FROM {T} WHERE tenant = $1 AND id = $2`

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

// listFilter is the list's filters, the same in both of its parts.
const listFilter = ` AND ($3 = '' OR status = $3) AND ($4 = '' OR topic = $4) AND ($5 = '' OR grp = $5)
		AND (NOT $7::boolean OR (status = 'FAILED' AND blocks_group))`

// listSQL reads a tenant's messages: the (tenant, seq) index holds every
// row but the leased ones (claimed_by set: see migration 10), which the
// lease index holds; the two are merged by seq.
const listSQL = `SELECT {COLS} FROM (
	(SELECT {COLS} FROM {T}
	WHERE tenant = $1 AND seq > $2 AND claimed_by IS NULL AND status <> 'PROCESSING'` + listFilter + `
	ORDER BY seq
	LIMIT $6)
	UNION ALL
	(SELECT {COLS} FROM {T}
	WHERE status = 'PROCESSING' AND tenant = $1 AND seq > $2` + listFilter + `
	ORDER BY seq
	LIMIT $6)
) l
ORDER BY seq
LIMIT $6`

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

// countSQL counts a tenant's messages by status, in the (tenant, seq)
// index and the lease index, as listSQL reads them.
const countSQL = `SELECT status, count(*) FROM (
	SELECT status FROM {T} WHERE tenant = $1 AND claimed_by IS NULL AND status <> 'PROCESSING'
	UNION ALL
	SELECT status FROM {T} WHERE status = 'PROCESSING' AND tenant = $1
) c
GROUP BY status`

// countAllSQL counts every message by status.
const countAllSQL = `SELECT status, count(*) FROM {T} GROUP BY status`

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

// attemptsSQL reads the attempts of a message, with a first-attempt
// success read from the message row (sent_* columns: see finishSQL) as
// attempt 1.
const attemptsSQL = `SELECT message_id, tenant, number, outcome, error_code, error_message, provider_response,
	next_attempt_at, started_at, finished_at
FROM (
	SELECT 0::bigint AS k, m.id AS message_id, m.tenant, 1 AS number, 'SUCCEEDED'::text AS outcome,
		NULL::text AS error_code, NULL::text AS error_message, m.sent_response AS provider_response,
		NULL::timestamptz AS next_attempt_at, m.sent_started_at AS started_at, m.sent_finished_at AS finished_at
	FROM {T} m
	WHERE m.tenant = $1 AND m.id = $2 AND m.sent_finished_at IS NOT NULL
	UNION ALL
	SELECT id, message_id, tenant, number, outcome, error_code, error_message, provider_response,
		next_attempt_at, started_at, finished_at
	FROM {A} WHERE tenant = $1 AND message_id = $2
) h
ORDER BY k`

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

// cancelSQL cancels a PENDING message or a dead letter. A cancelled dead
// letter that blocked its group releases it: the processors are woken.
const cancelSQL = `WITH upd AS (
	UPDATE {T} SET status = 'CANCELLED', updated_at = $3, blocks_group = false
	WHERE tenant = $1 AND id = $2 AND status IN ('PENDING', 'FAILED')
	RETURNING {COLS}
), woke AS (
	SELECT count(pg_notify($4, '')) AS n FROM (SELECT 1 FROM upd LIMIT 1) x WHERE $4 <> ''
)
SELECT upd.* FROM upd CROSS JOIN woke`

// MessageCancel moves a PENDING message or a dead letter (FAILED) to
// CANCELLED, and wakes the processors (a dead letter that blocked its group
// releases it). A message in another status returns an error wrapping
// outbox.ErrInvalidTransition; an unknown one, outbox.ErrNotFound.
func (s *Store) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	now := s.at(p.Now)
	return s.operateOne(ctx, "cancel", outbox.EventCancel, p.Tenant, p.ID, now, s.sql.cancel, s.lsql.cancel,
		text(p.Tenant), text(p.ID), now, s.notifyChannel())
}

// operateOne runs an operator's change of the message (tenant, id): stmt,
// or on the append-only path logStmt under its group's claim locks
// (logOperate), with args. When it changes no row, the message is not in
// a status ev applies to: the error says why (transitionErr).
func (s *Store) operateOne(ctx context.Context, op string, ev outbox.Event, tenant, id string, now time.Time, stmt, logStmt string, args ...any) (outbox.Message, error) {
	var m outbox.Message
	var err error
	if s.logMode {
		err = s.logOperate(ctx, []string{text(id)}, now, func(tx pgx.Tx) error {
			m, err = scanMessage(tx.QueryRow(ctx, logStmt, args...))
			return err
		})
	} else {
		m, err = scanMessage(s.db.QueryRow(ctx, stmt, args...))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.Message{}, s.transitionErr(ctx, tenant, id, ev)
	}
	if err != nil {
		return outbox.Message{}, wrapErr(op, err)
	}
	return m, nil
}

// requeueSet is what a requeue sets (MessageRequeue).
const requeueSet = `status = 'PENDING', attempts = 0, recoveries = 0, next_attempt_at = $3, updated_at = $3,
		claimed_at = NULL, claimed_by = NULL, claim_token = NULL, provider_message_id = NULL, blocks_group = false,
		sent_at = NULL, delivered_at = NULL, read_at = NULL,
		sent_response = NULL, sent_started_at = NULL, sent_finished_at = NULL`

// requeueSQL requeues a dead letter. A requeue clears sent_at: a
// first-attempt success kept on the message row moves to the attempts
// table first. A dead letter of a group that did not hold its group (later
// messages may have been published since) takes a new sequence number,
// drawn under its group's enqueue lock: it goes to the end of its group,
// as a new message would, and stays above every group floor (see
// groupFloors). One that held its group keeps its place (first).
const requeueSQL = `WITH old AS (
	SELECT id, tenant, topic, grp, blocks_group, sent_response, sent_started_at, sent_finished_at FROM {T}
	WHERE tenant = $1 AND id = $2 AND status = 'FAILED'
	FOR UPDATE
), lk AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock($5::int4, hashtext(tenant || chr(31) || topic || chr(31) || grp))) AS n
	FROM old WHERE grp <> '' AND NOT blocks_group
), upd_keep AS (
	UPDATE {T} m SET ` + requeueSet + `
	FROM old
	WHERE m.id = old.id AND m.status = 'FAILED' AND (old.blocks_group OR old.grp = '')
	RETURNING {MCOLS}
), upd_move AS (
	UPDATE {T} m SET seq = DEFAULT, ` + requeueSet + `
	FROM old CROSS JOIN lk
	WHERE m.id = old.id AND m.status = 'FAILED' AND NOT old.blocks_group AND old.grp <> '' AND lk.n >= 0
	RETURNING {MCOLS}
), upd AS (
	SELECT * FROM upd_keep UNION ALL SELECT * FROM upd_move
), kept AS (
	INSERT INTO {A} (message_id, tenant, number, outcome, provider_response, started_at, finished_at)
	SELECT old.id, old.tenant, 1, 'SUCCEEDED', old.sent_response, old.sent_started_at, old.sent_finished_at
	FROM old JOIN upd ON upd.id = old.id
	WHERE old.sent_finished_at IS NOT NULL
), woke AS (
	SELECT count(pg_notify($4, '')) AS n FROM (SELECT 1 FROM upd LIMIT 1) x WHERE $4 <> ''
)
SELECT upd.* FROM upd CROSS JOIN woke`

// MessageRequeue moves a FAILED message back to PENDING, due at p.Now, with
// its attempts reset and its provider fields cleared, and wakes the
// processors. Other statuses return an error wrapping
// outbox.ErrInvalidTransition.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	now := s.at(p.Now)
	return s.operateOne(ctx, "requeue", outbox.EventRequeue, p.Tenant, p.ID, now, s.sql.requeue, s.lsql.requeue,
		text(p.Tenant), text(p.ID), now, s.notifyChannel(), s.groupNS)
}

// statusOfSQL reads one message's status, to tell why a change was
// refused.
const statusOfSQL = `SELECT status FROM {T} WHERE tenant = $1 AND id = $2`

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

// receiptLockSQL reads and locks the latest message a provider's
// receipt names (tenant, provider message ID).
const receiptLockSQL = `SELECT {COLS} FROM {T}
WHERE tenant = $1 AND provider_message_id = $2
ORDER BY seq DESC
LIMIT 1
FOR UPDATE`

// receiptUpdateSQL writes the state a receipt moved a message to.
const receiptUpdateSQL = `UPDATE {T} SET status = $2, sent_at = $3, delivered_at = $4, read_at = $5,
	last_error_code = $6, last_error_message = $7, updated_at = $8
WHERE id = $1`

// MessageApplyReceipt applies a provider receipt to the tenant's message
// with that provider message ID (the newest, if several), with
// outbox.ApplyReceipt's rule: idempotent, never backwards. It locks the row
// for the read-modify-write, so concurrent receipts for one message apply
// one after the other.
func (s *Store) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.ReceiptResult{}, err
	}
	rc := p.Receipt
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

// pruneSQL deletes up to $2 finished messages (statuses $3, of topic $4
// or any) last changed before $1, oldest first, with their attempts; rows
// another transaction holds are skipped. A dead letter that holds its
// group is never pruned.
const pruneSQL = `WITH victims AS (
	SELECT id FROM {T}
	WHERE status = ANY($3::text[]) AND updated_at < $1 AND NOT blocks_group AND ($4 = '' OR topic = $4)
	ORDER BY updated_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), del AS (
	DELETE FROM {T} m USING victims v WHERE m.id = v.id RETURNING m.id
), del_attempts AS (
	DELETE FROM {A} a USING del WHERE a.message_id = del.id
)
SELECT count(*) FROM del`

// pruneCountSQL counts the messages pruneSQL would delete, without its
// limit (a dry run).
const pruneCountSQL = `SELECT count(*) FROM {T}
	WHERE status = ANY($2::text[]) AND updated_at < $1 AND NOT blocks_group AND ($3 = '' OR topic = $3)`

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
