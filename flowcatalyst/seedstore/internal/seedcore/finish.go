package seedcore

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Batch is the outcomes of one kind for one table: ids, the claim time of
// each (the fence), and per kind the retry delay (µs from the database's
// NOW()), retry_count, error text or deferral.
type Batch struct {
	IDs     []string
	Claimed []time.Time
	Next    []int64  // retry: the delay
	Retry   []int    // retry: the new retry_count
	Msgs    []string // retry, dead: error_message
	DeferTo []*int64 // released: the delay of a deferral; nil is due at once
}

// Work is the outcomes for one table, by kind.
type Work struct{ Sent, Retry, Dead, Released Batch }

// Finish is a MessageFinish being applied: the work per table (by topic),
// and the result so far (the outcomes whose lease this Store does not
// hold).
type Finish struct {
	Tables map[string]*Work
	Result outbox.FinishResult
	keys   []heldLease
}

// BeginFinish validates p and sorts its outcomes by table and kind,
// fenced by the leases this Store holds: an outcome applies only to the
// claim it was made for (the same table, id, attempt and claim token).
// Outcomes are matched to leases by (topic, id): an event and a dispatch
// job may share an id. Outcomes without a lease are in Result.LeaseLost.
func (c *Core) BeginFinish(p outbox.MessageFinishParams) (*Finish, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	for _, o := range p.Outcomes {
		if o.BlockGroup {
			return nil, NoBlocking(outbox.DeadLetterRule{Default: outbox.DeadLetterBlock})
		}
	}
	now := At(p.Now)
	// delay turns a due time on the caller's clock into a delay from the
	// database's NOW(), in microseconds, so skewed clocks do not matter.
	delay := func(t time.Time) int64 { return max(At(t).Sub(now), 0).Microseconds() }
	f := &Finish{Tables: map[string]*Work{}}
	for _, o := range p.Outcomes {
		topic, l, ok := c.leaseOf(o.Topic, o.ID)
		if !ok || l.attempt != o.Attempt || l.token != o.ClaimToken {
			f.Result.LeaseLost = append(f.Result.LeaseLost, o.ID)
			continue
		}
		f.keys = append(f.keys, heldLease{leaseKey{topic, o.ID}, l.gen})
		w := f.Tables[topic]
		if w == nil {
			w = &Work{}
			f.Tables[topic] = w
		}
		var b *Batch
		switch o.Kind {
		case outbox.OutcomeSent:
			b = &w.Sent
		case outbox.OutcomeRetry:
			b = &w.Retry
			b.Next = append(b.Next, delay(o.NextAttemptAt))
			b.Retry = append(b.Retry, o.Attempt)
			b.Msgs = append(b.Msgs, ErrorText(*o.Error))
		case outbox.OutcomeDead:
			b = &w.Dead
			b.Msgs = append(b.Msgs, ErrorText(*o.Error))
		case outbox.OutcomeReleased:
			b = &w.Released
			// A deferral (quota, throttle) keeps the row PENDING until
			// then; a plain release makes it due at once (processed_at
			// NULL).
			var next *int64
			if !o.NextAttemptAt.IsZero() {
				n := delay(o.NextAttemptAt)
				next = &n
			}
			b.DeferTo = append(b.DeferTo, next)
		}
		b.IDs, b.Claimed = append(b.IDs, o.ID), append(b.Claimed, l.claimedAt)
	}
	return f, nil
}

// End is called once f's work is committed, with the ids of the outcomes
// that did not apply (their lease was lost in the database): it forgets
// the leases f used and returns the result.
func (c *Core) End(f *Finish, lost []string) outbox.FinishResult {
	c.forget(f.keys)
	f.Result.LeaseLost = append(f.Result.LeaseLost, lost...)
	return f.Result
}

// BeginRecover validates p and returns the processing timeout in
// microseconds (p.Now - p.ClaimedBefore: only the difference counts, the
// stores compare with the database's clock) and the claim time before
// which this Store's leases have expired (for EndRecover).
func BeginRecover(p outbox.MessageRecoverParams) (timeout int64, before time.Time, err error) {
	if err := p.Validate(); err != nil {
		return 0, time.Time{}, err
	}
	if p.MaxAttempts < 1 {
		return 0, time.Time{}, outbox.InvalidParam("MaxAttempts", "must be positive")
	}
	if err := NoBlocking(p.DeadLetter); err != nil {
		return 0, time.Time{}, err
	}
	before = At(p.ClaimedBefore)
	return max(At(p.Now).Sub(before), 0).Microseconds(), before, nil
}

// EndRecover forgets the leases taken before before: they expired, and
// their outcomes will be refused anyway.
func (c *Core) EndRecover(before time.Time) { c.forgetBefore(before) }

// NoBlocking refuses a dead-letter rule that blocks some topic: the seed's
// tables have no place to mark a dead letter that holds its group (the
// stores do not implement outbox.DeadLetterBlocker, so a processor refuses
// such a rule at start).
func NoBlocking(r outbox.DeadLetterRule) error {
	if def, block, _ := r.BlockingTopics(); def || len(block) > 0 {
		return fmt.Errorf("seedstore: dead letters cannot block their group on the seed's tables: %w", errors.ErrUnsupported)
	}
	return nil
}
