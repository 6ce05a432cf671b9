package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageFinish implements outbox.Store: it records a batch of outcomes of
// one owner in one transaction: one locking read of the batch's leases, one
// UPDATE per kind of outcome (per-message values chosen with CASE), and one
// INSERT of the attempt rows. Every outcome is fenced by the lease (status
// PROCESSING, ClaimedBy = p.Owner, Attempts = the outcome's Attempt); one
// whose lease was lost changes nothing and its ID is returned in LeaseLost.
// Sent, retry and dead outcomes add a row to the attempt history; a release
// does not (the attempt is not counted). A release with NextAttemptAt is a
// deferral: the message is due again at that time, with LastError set from
// its Error; a plain release keeps its due time and LastError.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	var res outbox.FinishResult
	if p.Owner == "" {
		return res, outbox.InvalidParam("Owner", "is required")
	}
	total := len(p.Sent) + len(p.Retry) + len(p.Dead) + len(p.Released)
	if total == 0 {
		return res, nil
	}
	want := make(map[string]int, total) // id -> attempt
	var order []string
	add := func(kind string, i int, id string, attempt int) error {
		if id == "" {
			return outbox.InvalidParam(fmt.Sprintf("%s[%d].ID", kind, i), "is required")
		}
		if _, dup := want[id]; dup {
			return outbox.InvalidParam(fmt.Sprintf("%s[%d].ID", kind, i), "has more than one outcome in this call")
		}
		want[id] = attempt
		order = append(order, id)
		return nil
	}
	for i, o := range p.Sent {
		if err := add("Sent", i, o.ID, o.Attempt); err != nil {
			return res, err
		}
	}
	for i, o := range p.Retry {
		if err := add("Retry", i, o.ID, o.Attempt); err != nil {
			return res, err
		}
	}
	for i, o := range p.Dead {
		if err := add("Dead", i, o.ID, o.Attempt); err != nil {
			return res, err
		}
	}
	for i, o := range p.Released {
		if err := add("Released", i, o.ID, o.Attempt); err != nil {
			return res, err
		}
	}
	now := s.now(p.Now)
	nowS := ts(now)
	started := func(t time.Time) string {
		if t.IsZero() {
			return nowS
		}
		return ts(s.now(t))
	}
	m := s.q.messages
	applied := 0
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res.LeaseLost, applied = nil, 0
		// The leases that hold, locked until commit.
		args := []any{p.Owner}
		for _, id := range order {
			args = append(args, id)
		}
		// Only the batch's rows are locked, through the id index, in id
		// order: concurrent finishers never lock rows they do not name, so
		// they do not deadlock. Status and owner are checked here, not in
		// the WHERE clause, which could lead the optimizer to scan (and
		// lock) every PROCESSING row.
		rows, err := tx.QueryContext(ctx, `SELECT seq, id, tenant, attempts, status, claimed_by
			FROM `+m+` FORCE INDEX (`+s.prefix+`messages_id)
			WHERE id IN (`+placeholders(len(order))+`) ORDER BY id FOR UPDATE`, args[1:]...)
		if err != nil {
			return err
		}
		held := make(map[string]string, len(order)) // id -> tenant
		seqOf := make(map[string]int64, len(order))
		for rows.Next() {
			var id, tenant, status string
			var owner sql.NullString
			var seq int64
			var attempts int
			if err := rows.Scan(&seq, &id, &tenant, &attempts, &status, &owner); err != nil {
				rows.Close()
				return err
			}
			if status == string(outbox.StatusProcessing) && owner.String == p.Owner && want[id] == attempts {
				held[id] = tenant
				seqOf[id] = seq
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range order {
			if _, ok := held[id]; !ok {
				res.LeaseLost = append(res.LeaseLost, id)
			}
		}
		applied = len(held)
		if applied == 0 {
			return nil
		}
		var att attemptRows
		// Sent.
		var sent caseUpdate
		for _, o := range p.Sent {
			tenant, ok := held[o.ID]
			if !ok {
				continue
			}
			sent.add(seqOf[o.ID], nullString(o.ProviderMessageID))
			att.add(o.ID, tenant, o.Attempt, outbox.AttemptSucceeded, nil, o.ProviderResponse, nil, started(o.StartedAt), nowS)
		}
		if err := sent.exec(ctx, tx, m, `status = 'SENT', provider_message_id = {0}, sent_at = ?, updated_at = ?,
			claimed_at = NULL, claimed_by = NULL`, nowS, nowS); err != nil {
			return err
		}
		// Retry.
		var retry caseUpdate
		for _, o := range p.Retry {
			tenant, ok := held[o.ID]
			if !ok {
				continue
			}
			next := ts(s.now(o.NextAttemptAt))
			e := o.Error
			retry.add(seqOf[o.ID], next, e.Code, e.Message)
			att.add(o.ID, tenant, o.Attempt, outbox.AttemptRetry, &e, o.ProviderResponse, next, started(o.StartedAt), nowS)
		}
		if err := retry.exec(ctx, tx, m, `status = 'PENDING', next_attempt_at = {0}, last_error_code = {1},
			last_error_message = {2}, updated_at = ?, claimed_at = NULL, claimed_by = NULL`, nowS); err != nil {
			return err
		}
		// Dead.
		var dead caseUpdate
		for _, o := range p.Dead {
			tenant, ok := held[o.ID]
			if !ok {
				continue
			}
			e := o.Error
			dead.add(seqOf[o.ID], e.Code, e.Message)
			att.add(o.ID, tenant, o.Attempt, outbox.AttemptFailed, &e, o.ProviderResponse, nil, started(o.StartedAt), nowS)
		}
		if err := dead.exec(ctx, tx, m, `status = 'FAILED', last_error_code = {0}, last_error_message = {1},
			updated_at = ?, claimed_at = NULL, claimed_by = NULL`, nowS); err != nil {
			return err
		}
		// Released: the attempt is not counted; a deferral sets the due
		// time and the reason.
		var rel caseUpdate
		for _, o := range p.Released {
			if _, ok := held[o.ID]; !ok {
				continue
			}
			var next, code, msg any
			if !o.NextAttemptAt.IsZero() {
				next = ts(s.now(o.NextAttemptAt))
				if o.Error != nil {
					code, msg = o.Error.Code, o.Error.Message
				}
			}
			rel.add(seqOf[o.ID], next, code, msg)
		}
		if err := rel.exec(ctx, tx, m, `status = 'PENDING', attempts = attempts - 1, updated_at = ?,
			next_attempt_at = COALESCE({0}, next_attempt_at),
			last_error_code = CASE WHEN {1} IS NULL THEN last_error_code ELSE {1} END,
			last_error_message = CASE WHEN {1} IS NULL THEN last_error_message ELSE {2} END,
			claimed_at = NULL, claimed_by = NULL`, nowS); err != nil {
			return err
		}
		return att.exec(ctx, tx, s.q.attempts)
	})
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("mysql: finish: %w", err)
	}
	if applied > 0 {
		s.Notify() // a finished message may unblock the next one of its group
	}
	return res, nil
}

// caseUpdate builds one UPDATE of several messages by seq (the primary
// key), each with its own values: {i} in the SET list becomes
// CASE seq WHEN ? THEN ? ... END.
type caseUpdate struct {
	seqs []int64
	vals [][]any
}

func (c *caseUpdate) add(seq int64, vals ...any) {
	c.seqs = append(c.seqs, seq)
	c.vals = append(c.vals, vals)
}

// exec runs UPDATE table SET set WHERE seq IN (...); set's plain ? marks
// take fixed, in order.
func (c *caseUpdate) exec(ctx context.Context, q querier, table, set string, fixed ...any) error {
	if len(c.seqs) == 0 {
		return nil
	}
	// Placeholders appear in the SET list in text order; collect the
	// arguments in that order.
	var b strings.Builder
	var args []any
	fi := 0
	for i := 0; i < len(set); i++ {
		switch {
		case set[i] == '?':
			b.WriteByte('?')
			args = append(args, fixed[fi])
			fi++
		case set[i] == '{':
			j := strings.IndexByte(set[i:], '}')
			col := 0
			_, _ = fmt.Sscanf(set[i+1:i+j], "%d", &col)
			b.WriteString("CASE seq")
			for k, seq := range c.seqs {
				b.WriteString(" WHEN ? THEN ?")
				args = append(args, seq, c.vals[k][col])
			}
			b.WriteString(" END")
			i += j
		default:
			b.WriteByte(set[i])
		}
	}
	for _, seq := range c.seqs {
		args = append(args, seq)
	}
	_, err := q.ExecContext(ctx, `UPDATE `+table+` SET `+b.String()+` WHERE seq IN (`+placeholders(len(c.seqs))+`)`, args...)
	return err
}

// attemptRows collects attempt rows for one multi-row INSERT.
type attemptRows struct{ args []any }

func (a *attemptRows) add(id, tenant string, n int, outcome outbox.AttemptOutcome, e *outbox.ErrorInfo, resp json.RawMessage, next any, start, finish string) {
	var code, msg any
	if e != nil {
		code, msg = e.Code, e.Message
	}
	a.args = append(a.args, id, tenant, n, string(outcome), code, msg, nullJSON(resp), next, start, finish)
}

func (a *attemptRows) exec(ctx context.Context, q querier, table string) error {
	if len(a.args) == 0 {
		return nil
	}
	row := "(" + placeholders(10) + ")"
	n := len(a.args) / 10
	_, err := q.ExecContext(ctx, `INSERT INTO `+table+` (`+attemptCols+`) VALUES `+
		strings.TrimSuffix(strings.Repeat(row+", ", n), ", "), a.args...)
	return err
}

// leaseExpiredCode is the LastError code of a message whose lease expired.
const leaseExpiredCode = "lease_expired"

const leaseExpiredMsg = "the lease expired before the outcome was recorded (the processor stopped or stalled)"

// recoverChunk is how many expired leases one transaction of
// MessageRecover handles.
const recoverChunk = 1000

// MessageRecover implements outbox.Store: every PROCESSING message claimed
// before p.ClaimedBefore goes back to PENDING (due at once), or to FAILED
// when it has used all its attempts (its MaxAttempts, or p.MaxAttempts when
// 0, or outbox.DefaultMaxAttempts when both are 0). Both get LastError code
// "lease_expired" and an attempt row recording the lost attempt. It works in
// transactions of 1,000 messages, skipping rows a concurrent outcome holds.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	var res outbox.RecoverResult
	if p.ClaimedBefore.IsZero() {
		return res, outbox.InvalidParam("ClaimedBefore", "is required")
	}
	if p.MaxAttempts < 0 {
		return res, outbox.InvalidParam("MaxAttempts", "must not be negative")
	}
	maxAttempts := p.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = outbox.DefaultMaxAttempts
	}
	now := s.now(p.Now)
	nowS, before := ts(now), ts(s.now(p.ClaimedBefore))
	m := s.q.messages
	for {
		var n, nDead, nBack int
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			rows, err := tx.QueryContext(ctx, `SELECT seq, id, tenant, attempts, max_attempts, claimed_at FROM `+m+`
				WHERE status = 'PROCESSING' AND claimed_at < ? ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`, before, recoverChunk)
			if err != nil {
				return err
			}
			var dead, back []any
			var att attemptRows
			n, nDead, nBack = 0, 0, 0
			for rows.Next() {
				var id, tenant string
				var seq int64
				var attempts, maxA int
				var claimed dbTime
				if err := rows.Scan(&seq, &id, &tenant, &attempts, &maxA, &claimed); err != nil {
					rows.Close()
					return err
				}
				n++
				limit := maxA
				if limit <= 0 {
					limit = maxAttempts
				}
				e := &outbox.ErrorInfo{Code: leaseExpiredCode, Message: leaseExpiredMsg}
				start := nowS
				if claimed.valid {
					start = ts(claimed.t)
				}
				if attempts >= limit {
					dead = append(dead, seq)
					att.add(id, tenant, attempts, outbox.AttemptFailed, e, nil, nil, start, nowS)
				} else {
					back = append(back, seq)
					att.add(id, tenant, attempts, outbox.AttemptRetry, e, nil, nowS, start, nowS)
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			if err := att.exec(ctx, tx, s.q.attempts); err != nil {
				return err
			}
			if len(dead) > 0 {
				if _, err := tx.ExecContext(ctx, `UPDATE `+m+` SET status = 'FAILED', last_error_code = ?,
					last_error_message = ?, updated_at = ?, claimed_at = NULL, claimed_by = NULL
					WHERE seq IN (`+placeholders(len(dead))+`)`,
					append([]any{leaseExpiredCode, leaseExpiredMsg, nowS}, dead...)...); err != nil {
					return err
				}
			}
			if len(back) > 0 {
				if _, err := tx.ExecContext(ctx, `UPDATE `+m+` SET status = 'PENDING', last_error_code = ?,
					last_error_message = ?, next_attempt_at = LEAST(next_attempt_at, CAST(? AS DATETIME(6))),
					updated_at = ?, claimed_at = NULL, claimed_by = NULL
					WHERE seq IN (`+placeholders(len(back))+`)`,
					append([]any{leaseExpiredCode, leaseExpiredMsg, nowS, nowS}, back...)...); err != nil {
					return err
				}
			}
			nDead, nBack = len(dead), len(back)
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("mysql: recover: %w", err)
		}
		res.DeadLettered += nDead
		res.Recovered += nBack
		if n < recoverChunk {
			break
		}
	}
	if res.Recovered+res.DeadLettered > 0 {
		s.Notify()
	}
	return res, nil
}
