package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageClaim implements outbox.Store: in one BEGIN IMMEDIATE transaction it
// leases up to p.Limit due PENDING messages to p.Owner (PROCESSING,
// Attempts+1, ClaimedAt = Now), in Seq order, keeping FIFO per group: a
// message is skipped while an earlier message of its (tenant, topic, group)
// is PROCESSING or PENDING and not claimed in the same call. Messages of
// group "" are never blocked.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 {
		return nil, outbox.InvalidParam("Limit", "must be positive")
	}
	if p.Owner == "" {
		return nil, outbox.InvalidParam("Owner", "is required")
	}
	now := s.now(p.Now)
	query, args := s.q.claim, []any{now.UnixMicro(), p.Limit, p.Owner}
	if len(p.Topics) > 0 {
		b, err := json.Marshal(p.Topics)
		if err != nil {
			return nil, outbox.InvalidParam("Topics", err.Error())
		}
		query, args = s.q.claimTopics, append(args, string(b))
	}
	var out []outbox.Message
	err := s.writeTx(ctx, func(q querier) error {
		rows, err := q.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		out, err = scanMessages(rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sqlite: claim: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// MessageFinish implements outbox.Store: it records a batch of outcomes in
// one transaction. Every outcome is fenced by the lease (PROCESSING,
// ClaimedBy = Owner, Attempts = Attempt); one whose lease was lost changes
// nothing and its ID is returned in LeaseLost. Sent, retry and dead outcomes
// add a row to the attempt history; a release does not (the attempt is not
// counted).
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	var res outbox.FinishResult
	if p.Owner == "" {
		return res, outbox.InvalidParam("Owner", "is required")
	}
	if len(p.Sent)+len(p.Retry)+len(p.Dead)+len(p.Released) == 0 {
		return res, nil
	}
	now := s.now(p.Now)
	started := func(t any) any {
		if t == nil {
			return now.UnixMicro()
		}
		return t
	}
	applied := 0
	err := s.writeTx(ctx, func(q querier) error {
		res.LeaseLost = nil
		applied = 0
		// fenced runs one fenced update; ok is false when the lease was lost.
		fenced := func(id, query string, args ...any) (tenant string, ok bool, err error) {
			err = q.QueryRowContext(ctx, query, args...).Scan(&tenant)
			if isNoRows(err) {
				res.LeaseLost = append(res.LeaseLost, id)
				return "", false, nil
			}
			if err != nil {
				return "", false, fmt.Errorf("message %s: %w", id, err)
			}
			applied++
			return tenant, true, nil
		}
		attempt := func(id, tenant string, n int, outcome outbox.AttemptOutcome, e *outbox.ErrorInfo, resp json.RawMessage, next, start any) error {
			var code, msg any
			if e != nil {
				code, msg = e.Code, e.Message
			}
			_, err := q.ExecContext(ctx, s.q.insertAttempt, id, tenant, n, string(outcome), code, msg,
				nullJSON(resp), next, started(start), now.UnixMicro())
			if err != nil {
				return fmt.Errorf("message %s: attempt: %w", id, err)
			}
			return nil
		}
		for _, o := range p.Sent {
			tenant, ok, err := fenced(o.ID, s.q.sent, nullString(o.ProviderMessageID), now.UnixMicro(), now.UnixMicro(), o.ID, p.Owner, o.Attempt)
			if err != nil {
				return err
			}
			if ok {
				if err := attempt(o.ID, tenant, o.Attempt, outbox.AttemptSucceeded, nil, o.ProviderResponse, nil, micros(o.StartedAt)); err != nil {
					return err
				}
			}
		}
		for _, o := range p.Retry {
			next := s.now(o.NextAttemptAt)
			tenant, ok, err := fenced(o.ID, s.q.retry, next.UnixMicro(), o.Error.Code, o.Error.Message, now.UnixMicro(), o.ID, p.Owner, o.Attempt)
			if err != nil {
				return err
			}
			if ok {
				e := o.Error
				if err := attempt(o.ID, tenant, o.Attempt, outbox.AttemptRetry, &e, o.ProviderResponse, next.UnixMicro(), micros(o.StartedAt)); err != nil {
					return err
				}
			}
		}
		for _, o := range p.Dead {
			tenant, ok, err := fenced(o.ID, s.q.dead, o.Error.Code, o.Error.Message, now.UnixMicro(), o.ID, p.Owner, o.Attempt)
			if err != nil {
				return err
			}
			if ok {
				e := o.Error
				if err := attempt(o.ID, tenant, o.Attempt, outbox.AttemptFailed, &e, o.ProviderResponse, nil, micros(o.StartedAt)); err != nil {
					return err
				}
			}
		}
		for _, o := range p.Released {
			if _, _, err := fenced(o.ID, s.q.release, now.UnixMicro(), o.ID, p.Owner, o.Attempt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("sqlite: finish: %w", err)
	}
	if applied > 0 {
		s.Notify() // a finished message may unblock the next one of its group
	}
	return res, nil
}

// leaseExpiredCode is the LastError code of a message whose lease expired.
const leaseExpiredCode = "lease_expired"

// MessageRecover implements outbox.Store: every PROCESSING message claimed
// before p.ClaimedBefore goes back to PENDING (due at once), or to FAILED
// when it has used all its attempts (its MaxAttempts, or p.MaxAttempts when
// 0, or outbox.DefaultMaxAttempts when both are 0). Both get LastError code
// "lease_expired" and an attempt row recording the lost attempt.
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
	before := s.now(p.ClaimedBefore).UnixMicro()
	m, a := s.q.messages, s.q.attempts
	const exhausted = `attempts >= (CASE WHEN max_attempts > 0 THEN max_attempts ELSE ?3 END)`
	const msg = "the lease expired before the outcome was recorded (the processor stopped or stalled)"
	err := s.writeTx(ctx, func(q querier) error {
		// Attempt rows first, while the messages are still PROCESSING.
		_, err := q.ExecContext(ctx, `INSERT INTO `+a+` (`+attemptCols+`)
			SELECT id, tenant, attempts,
				CASE WHEN `+exhausted+` THEN 'FAILED' ELSE 'RETRY' END,
				?4, ?5, NULL,
				CASE WHEN `+exhausted+` THEN NULL ELSE ?2 END,
				claimed_at, ?2
			FROM `+m+` WHERE status = 'PROCESSING' AND claimed_at < ?1 ORDER BY seq`,
			before, now.UnixMicro(), maxAttempts, leaseExpiredCode, msg)
		if err != nil {
			return err
		}
		r, err := q.ExecContext(ctx, `UPDATE `+m+` SET status = 'FAILED', last_error_code = ?4, last_error_message = ?5,
			updated_at = ?2, claimed_at = NULL, claimed_by = NULL
			WHERE status = 'PROCESSING' AND claimed_at < ?1 AND `+exhausted,
			before, now.UnixMicro(), maxAttempts, leaseExpiredCode, msg)
		if err != nil {
			return err
		}
		n, _ := r.RowsAffected()
		res.DeadLettered = int(n)
		r, err = q.ExecContext(ctx, `UPDATE `+m+` SET status = 'PENDING', last_error_code = ?3, last_error_message = ?4,
			next_attempt_at = MIN(next_attempt_at, ?2), updated_at = ?2, claimed_at = NULL, claimed_by = NULL
			WHERE status = 'PROCESSING' AND claimed_at < ?1`,
			before, now.UnixMicro(), leaseExpiredCode, msg)
		if err != nil {
			return err
		}
		n, _ = r.RowsAffected()
		res.Recovered = int(n)
		return nil
	})
	if err != nil {
		return outbox.RecoverResult{}, fmt.Errorf("sqlite: recover: %w", err)
	}
	if res.Recovered+res.DeadLettered > 0 {
		s.Notify()
	}
	return res, nil
}
