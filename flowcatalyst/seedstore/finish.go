package seedstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// leaseOf returns the lease this Store holds on (topic, id). An outcome
// without a topic (a caller other than outbox's processor) matches only when
// the id is leased in exactly one table: ids are unique per table, not
// across the two, so an id alone never picks a table by guess.
func (s *Store) leaseOf(topic, id string) (*table, lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if topic != "" {
		t := s.tableOf(topic)
		if t == nil {
			return nil, lease{}, false
		}
		l, ok := s.leases[leaseKey{t.topic, id}]
		return t, l, ok
	}
	var found *table
	var fl lease
	for _, t := range s.tables {
		if l, ok := s.leases[leaseKey{t.topic, id}]; ok {
			if found != nil {
				return nil, lease{}, false
			}
			found, fl = t, l
		}
	}
	return found, fl, found != nil
}

// batch is the outcomes of one kind for one table: ids, the claim time of
// each (the fence), and per kind the retry delay (µs from the database's
// NOW()), retry_count, error text or deferral.
type batch struct {
	ids     []string
	claimed []time.Time
	next    []int64
	retry   []int
	msgs    []string
	deferTo []*int64
}

type perTable struct{ sent, retry, dead, released batch }

// MessageFinish records outcomes in one transaction, fenced by the claim:
// an outcome applies only while its row is PROCESSING with the processed_at
// this Store set when it claimed it (and the same attempt). Outcomes for
// rows this Store did not claim, or whose lease was lost, are returned in
// LeaseLost. Outcomes are matched to leases by (topic, id): an event and a
// dispatch job may share an id.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.FinishResult{}, err
	}
	for _, o := range p.Outcomes {
		if o.BlockGroup {
			return outbox.FinishResult{}, noBlocking(outbox.DeadLetterRule{Default: outbox.DeadLetterBlock})
		}
	}
	now := at(p.Now)
	// delay turns a due time on the caller's clock into a delay from the
	// database's NOW(), in microseconds, so skewed clocks do not matter.
	delay := func(t time.Time) int64 { return max(at(t).Sub(now), 0).Microseconds() }
	work := map[*table]*perTable{}
	var res outbox.FinishResult
	var keys []heldLease
	take := func(topic, id string, attempt int) (*table, time.Time, bool) {
		t, l, ok := s.leaseOf(topic, id)
		if !ok || l.attempt != attempt {
			return nil, time.Time{}, false
		}
		keys = append(keys, heldLease{leaseKey{t.topic, id}, l.gen})
		return t, l.claimedAt, true
	}
	get := func(t *table) *perTable {
		if work[t] == nil {
			work[t] = &perTable{}
		}
		return work[t]
	}
	for _, o := range p.Outcomes {
		t, c, ok := take(o.Topic, o.ID, o.Attempt)
		if !ok {
			res.LeaseLost = append(res.LeaseLost, o.ID)
			continue
		}
		w := get(t)
		var b *batch
		switch o.Kind {
		case outbox.OutcomeSent:
			b = &w.sent
		case outbox.OutcomeRetry:
			b = &w.retry
			b.next = append(b.next, delay(o.NextAttemptAt))
			b.retry = append(b.retry, o.Attempt)
			b.msgs = append(b.msgs, errorText(*o.Error))
		case outbox.OutcomeDead:
			b = &w.dead
			b.msgs = append(b.msgs, errorText(*o.Error))
		case outbox.OutcomeReleased:
			b = &w.released
			// A deferral (quota, throttle) keeps the row PENDING until
			// then; a plain release makes it due at once (processed_at
			// NULL).
			var next *int64
			if !o.NextAttemptAt.IsZero() {
				n := delay(o.NextAttemptAt)
				next = &n
			}
			b.deferTo = append(b.deferTo, next)
		}
		b.ids, b.claimed = append(b.ids, o.ID), append(b.claimed, c)
	}
	if len(work) == 0 {
		return res, nil
	}
	if s.mg != nil {
		dbNow, err := s.serverNow(ctx)
		if err != nil {
			return outbox.FinishResult{}, err
		}
		lost, err := s.finishMongo(ctx, work, dbNow)
		if err != nil {
			return outbox.FinishResult{}, err
		}
		s.forget(keys)
		res.LeaseLost = append(res.LeaseLost, lost...)
		return res, nil
	}
	if s.mysql {
		lost, err := s.finishMySQL(ctx, work)
		if err != nil {
			return outbox.FinishResult{}, err
		}
		s.forget(keys)
		res.LeaseLost = append(res.LeaseLost, lost...)
		return res, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("seedstore: finish: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var lost []string
	exec := func(stmt string, b batch, args ...any) error {
		if len(b.ids) == 0 {
			return nil
		}
		rows, err := tx.QueryContext(ctx, stmt, append([]any{b.ids, b.claimed}, args...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		done := map[string]bool{}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			done[id] = true
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range b.ids {
			if !done[id] {
				lost = append(lost, id)
			}
		}
		return nil
	}
	for _, t := range s.tables {
		w := work[t]
		if w == nil {
			continue
		}
		for _, step := range []func() error{
			func() error { return exec(t.sql.finishSent, w.sent) },
			func() error { return exec(t.sql.finishRetry, w.retry, w.retry.next, w.retry.retry, w.retry.msgs) },
			func() error { return exec(t.sql.finishDead, w.dead, w.dead.msgs) },
			func() error { return exec(t.sql.finishRelease, w.released, w.released.deferTo) },
		} {
			if err := step(); err != nil {
				return outbox.FinishResult{}, fmt.Errorf("seedstore: finish %s: %w", t.raw, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return outbox.FinishResult{}, fmt.Errorf("seedstore: finish: %w", err)
	}
	s.forget(keys)
	res.LeaseLost = append(res.LeaseLost, lost...)
	return res, nil
}

// forget drops the leases a committed finish used, and only those: once
// its transaction has committed, a row it made due again (a retry, a
// release) may already be claimed again, by this Store, under a new lease
// that must stay.
func (s *Store) forget(keys []heldLease) {
	if s.beforeForget != nil {
		s.beforeForget()
	}
	s.mu.Lock()
	for _, k := range keys {
		if l, ok := s.leases[k.key]; ok && l.gen == k.gen {
			delete(s.leases, k.key)
		}
	}
	s.mu.Unlock()
}

// MessageRecover puts back to PENDING every PROCESSING row claimed longer
// than p.Now - p.ClaimedBefore ago by the database's clock (its processor
// died or stalled). As in the seed, a recovered row keeps its retry_count
// ("no lost messages, just delayed"); with Options.RecoveryCountsAttempt the
// lost attempt is counted and a row that used its last attempt
// (p.MaxAttempts, which must be positive) is marked FAILED.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.RecoverResult{}, err
	}
	if p.MaxAttempts < 1 {
		return outbox.RecoverResult{}, outbox.InvalidParam("MaxAttempts", "must be positive")
	}
	if err := noBlocking(p.DeadLetter); err != nil {
		return outbox.RecoverResult{}, err
	}
	before := at(p.ClaimedBefore)
	timeout := max(at(p.Now).Sub(before), 0).Microseconds()
	var res outbox.RecoverResult
	for _, t := range s.tables {
		if s.mg != nil {
			rec, dead, err := s.recoverMongo(ctx, t, time.Duration(timeout)*time.Microsecond, p.MaxAttempts)
			res.Recovered += rec
			res.DeadLettered += dead
			if err != nil {
				return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
			}
			continue
		}
		if s.mysql {
			rec, dead, err := s.recoverMySQL(ctx, t, timeout, p.MaxAttempts)
			res.Recovered += rec
			res.DeadLettered += dead
			if err != nil {
				return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
			}
			continue
		}
		rows, err := s.db.QueryContext(ctx, t.sql.recover, timeout, p.MaxAttempts,
			errorText(outbox.ErrorInfo{Code: "lease_expired", Message: "the processor did not finish the attempt in time"}), s.recoveryCounts)
		if err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
		}
		for rows.Next() {
			var id, status string
			if err := rows.Scan(&id, &status); err != nil {
				rows.Close()
				return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
			}
			if status == StatusFailed {
				res.DeadLettered++
			} else {
				res.Recovered++
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
		}
	}
	// Forget leases that expired: their outcomes will be refused anyway.
	s.mu.Lock()
	for k, l := range s.leases {
		if l.claimedAt.Before(before) {
			delete(s.leases, k)
		}
	}
	s.mu.Unlock()
	return res, nil
}

// noBlocking refuses a dead-letter rule that blocks some topic: the seed's
// tables have no place to mark a dead letter that holds its group (the
// store does not implement outbox.DeadLetterBlocker, so a processor refuses
// such a rule at start).
func noBlocking(r outbox.DeadLetterRule) error {
	if def, block, _ := r.BlockingTopics(); def || len(block) > 0 {
		return fmt.Errorf("seedstore: dead letters cannot block their group on the seed's tables: %w", errors.ErrUnsupported)
	}
	return nil
}
