package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageClaim implements outbox.Store: in one BEGIN IMMEDIATE transaction it
// leases up to p.Limit due PENDING messages to p.Owner (PROCESSING,
// Attempts+1, ClaimedAt = Now) and returns them in Seq order. It keeps FIFO
// per group: within a (tenant, topic, group) only a contiguous prefix of the
// group's open messages is claimed, so a message is skipped while an earlier
// message of its group is PROCESSING or PENDING and not claimed in the same
// call. Messages of group "" are never blocked.
//
// Due unordered messages are taken oldest first. Groups are visited one
// index seek each, starting after the group where the previous claim of this
// Store stopped, so that with a small Limit no group starves.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 {
		return nil, outbox.InvalidParam("Limit", "must be positive")
	}
	if p.Owner == "" {
		return nil, outbox.InvalidParam("Owner", "is required")
	}
	now := s.now(p.Now)
	nowUS := now.UnixMicro()
	var topicsJSON string
	var topics map[string]bool
	if len(p.Topics) > 0 {
		b, err := json.Marshal(p.Topics)
		if err != nil {
			return nil, outbox.InvalidParam("Topics", err.Error())
		}
		topicsJSON = string(b)
		topics = make(map[string]bool, len(p.Topics))
		for _, t := range p.Topics {
			topics[t] = true
		}
	}
	var out []outbox.Message
	err := s.writeTx(ctx, func(q querier) error {
		// Unordered messages: the oldest due ones.
		var rows *sql.Rows
		var err error
		if topics == nil {
			rows, err = q.QueryContext(ctx, s.q.claimUnordered, nowUS, p.Limit)
		} else {
			rows, err = q.QueryContext(ctx, s.q.claimUnorderedTopics, nowUS, topicsJSON, p.Limit)
		}
		if err != nil {
			return err
		}
		var seqs []int64
		for rows.Next() {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				rows.Close()
				return err
			}
			seqs = append(seqs, seq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		// Ordered groups: the claimable prefix of each, up to Limit in all.
		ordered, err := s.claimGroups(ctx, q, nowUS, topics, p.Limit)
		if err != nil {
			return err
		}
		seqs = append(seqs, ordered...)
		if len(seqs) == 0 {
			return nil
		}
		slices.Sort(seqs)
		// Cutting the merged list at Limit keeps a prefix of every group.
		seqs = seqs[:min(len(seqs), p.Limit)]
		list, _ := json.Marshal(seqs)
		rows, err = q.QueryContext(ctx, s.q.claimUpdate, nowUS, p.Owner, nowUS, string(list))
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

// groupKey is (tenant, topic, grp), ordered as SQLite compares it (BINARY
// collation: byte order, as Go compares strings).
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

// claimGroups walks the groups that have open messages, from the store's
// cursor round to it again, and returns the seqs of up to limit claimable
// messages: for each group whose head (first open message) is PENDING and
// due, the run of PENDING due messages from the head on: at most
// Options.ClaimPerGroup of them while other groups wait, more when the walk
// ends with room left.
func (s *Store) claimGroups(ctx context.Context, q querier, nowUS int64, topics map[string]bool, limit int) ([]int64, error) {
	next, err := q.PrepareContext(ctx, s.q.nextGroupHead)
	if err != nil {
		return nil, err
	}
	defer next.Close()
	var prefix *sql.Stmt
	defer func() {
		if prefix != nil {
			prefix.Close()
		}
	}()

	s.mu.Lock()
	start := s.cursor
	s.mu.Unlock()
	perGroup := s.claimPerGroup
	var (
		out     []int64
		capped  []groupKey
		cur     = start
		wrapped = false
	)
	for len(out) < limit {
		var (
			k      groupKey
			status string
			due    int64
		)
		err := next.QueryRowContext(ctx, cur.tenant, cur.topic, cur.grp).Scan(&k.tenant, &k.topic, &k.grp, &status, &due)
		if isNoRows(err) {
			if wrapped || start == (groupKey{}) {
				break
			}
			wrapped, cur = true, groupKey{} // below every group: topics are never empty
			continue
		}
		if err != nil {
			return nil, err
		}
		if wrapped && start.less(k) {
			break // full circle: start itself is visited last
		}
		cur = k
		if k.grp == "" || (topics != nil && !topics[k.topic]) || status != string(outbox.StatusPending) || due > nowUS {
			continue
		}
		if prefix == nil {
			if prefix, err = q.PrepareContext(ctx, s.q.groupPrefix); err != nil {
				return nil, err
			}
		}
		n := min(perGroup, limit-len(out))
		seqs, err := readPrefix(ctx, prefix, k, nowUS, n, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, seqs...)
		if len(seqs) == n {
			capped = append(capped, k) // its run may go on
		}
	}
	s.mu.Lock()
	s.cursor = cur
	s.mu.Unlock()
	// Room left (few groups are claimable): extend the runs cut at perGroup,
	// so that a deep backlog in one group still fills a claim.
	for _, k := range capped {
		if len(out) >= limit {
			break
		}
		seqs, err := readPrefix(ctx, prefix, k, nowUS, limit-len(out), perGroup)
		if err != nil {
			return nil, err
		}
		out = append(out, seqs...)
	}
	return out, nil
}

// readPrefix reads up to n seqs of group k's open messages from offset on,
// stopping at the first one that is PROCESSING or not due. The offset
// messages before must be PENDING and due (read by an earlier call in the
// same transaction).
func readPrefix(ctx context.Context, prefix *sql.Stmt, k groupKey, nowUS int64, n, offset int) ([]int64, error) {
	rows, err := prefix.QueryContext(ctx, k.tenant, k.topic, k.grp, n, offset)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var seq, at int64
		var st string
		if err := rows.Scan(&seq, &st, &at); err != nil {
			return nil, err
		}
		if st != string(outbox.StatusPending) || at > nowUS {
			break
		}
		out = append(out, seq)
	}
	return out, rows.Err()
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
		// Each statement is prepared once per call, when first needed.
		stmts := map[string]*sql.Stmt{}
		defer func() {
			for _, st := range stmts {
				st.Close()
			}
		}()
		stmt := func(query string) (*sql.Stmt, error) {
			if st, ok := stmts[query]; ok {
				return st, nil
			}
			st, err := q.PrepareContext(ctx, query)
			if err != nil {
				return nil, err
			}
			stmts[query] = st
			return st, nil
		}
		// fenced runs one fenced update; ok is false when the lease was lost.
		fenced := func(id, query string, args ...any) (tenant string, ok bool, err error) {
			st, err := stmt(query)
			if err != nil {
				return "", false, err
			}
			err = st.QueryRowContext(ctx, args...).Scan(&tenant)
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
			st, err := stmt(s.q.insertAttempt)
			if err != nil {
				return err
			}
			_, err = st.ExecContext(ctx, id, tenant, n, string(outcome), code, msg,
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
			var next, code, msg any
			if !o.NextAttemptAt.IsZero() {
				next = o.NextAttemptAt.UTC().UnixMicro()
				if o.Error != nil {
					code, msg = o.Error.Code, o.Error.Message
				}
			}
			if _, _, err := fenced(o.ID, s.q.release, now.UnixMicro(), next, code, msg, o.ID, p.Owner, o.Attempt); err != nil {
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
