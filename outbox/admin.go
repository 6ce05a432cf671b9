package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Admin is an optional Store capability for operators: it sees across
// tenants, requeues dead letters in bulk and pauses topics and groups. The
// admin HTTP API (outbox/admin), the outboxctl command and the OpenTelemetry
// gauges (outbox/otel) use it; every store of this module implements it and
// the conformance suite tests it. Expose it to operators only: it is not
// scoped to one tenant.
type Admin interface {
	// MessageRequeueMany moves the FAILED messages that match a filter back
	// to PENDING (due now, attempts reset), in Seq order, at most Limit per
	// call, each call in one transaction: a bulk requeue is a loop of calls
	// that can stop anywhere and resume from NextAfterSeq (RequeueAll does
	// the loop). DryRun counts without changing anything.
	MessageRequeueMany(ctx context.Context, p MessageRequeueManyParams) (RequeueManyResult, error)
	// MessageSearch lists messages of every tenant matching a filter,
	// ordered by Seq.
	MessageSearch(ctx context.Context, p MessageSearchParams) (MessagePage, error)
	// PauseAdd pauses a topic or one group of it: its PENDING messages are
	// not claimed until PauseRemove (messages already claimed finish).
	// Pausing what is already paused is not an error.
	PauseAdd(ctx context.Context, p PauseAddParams) error
	// PauseList returns every pause, ordered by topic, group, tenant.
	PauseList(ctx context.Context, p PauseListParams) ([]Pause, error)
	// PauseRemove resumes what PauseAdd paused (the same Topic, Group and
	// Tenant) and reports whether such a pause existed.
	PauseRemove(ctx context.Context, p PauseRemoveParams) (bool, error)
	// TopicStats returns, per topic, the message counts by status and the
	// creation time of the oldest PENDING message, ordered by topic.
	TopicStats(ctx context.Context, p TopicStatsParams) ([]TopicStat, error)
}

// MessageFilter selects messages for operators. Zero fields match
// anything; set fields must all match.
type MessageFilter struct {
	// Tenants restricts to these tenants ("" is the single-tenant tenant);
	// empty means every tenant.
	Tenants []string
	Status  Status
	Topic   string
	// Group matches a message group; "" means any group (unordered
	// messages cannot be selected by group).
	Group string
	// ErrorCode matches the code of the message's LastError.
	ErrorCode string
	// CreatedAfter and CreatedBefore bound CreatedAt: CreatedAfter <=
	// CreatedAt < CreatedBefore.
	CreatedAfter, CreatedBefore time.Time
	// BlocksGroup, when true, matches only the dead letters that hold
	// their group (Message.BlocksGroup): the blocked groups.
	BlocksGroup bool
}

// IsZero reports whether f matches every message.
func (f MessageFilter) IsZero() bool {
	return len(f.Tenants) == 0 && f.Status == "" && f.Topic == "" && f.Group == "" && f.ErrorCode == "" &&
		f.CreatedAfter.IsZero() && f.CreatedBefore.IsZero() && !f.BlocksGroup
}

// Validate checks f and returns a *ValidationError (ErrInvalidInput).
func (f MessageFilter) Validate() error {
	if f.Status != "" && !f.Status.Valid() {
		return invalid("Filter.Status", fmt.Sprintf("%q is not a status", f.Status))
	}
	if len(f.Tenants) > 1000 {
		return invalid("Filter.Tenants", "lists more than 1000 tenants")
	}
	for _, s := range append([]string{f.Topic, f.Group, f.ErrorCode}, f.Tenants...) {
		if len(s) > MaxKeyLength {
			return invalid("Filter", fmt.Sprintf("a value is %d bytes, the limit is %d", len(s), MaxKeyLength))
		}
	}
	if !f.CreatedAfter.IsZero() && !f.CreatedBefore.IsZero() && !f.CreatedAfter.Before(f.CreatedBefore) {
		return invalid("Filter.CreatedAfter", "is not before CreatedBefore")
	}
	return nil
}

// Matches reports whether m matches f (stores without a query language and
// tests use it).
func (f MessageFilter) Matches(m *Message) bool {
	if len(f.Tenants) > 0 {
		found := false
		for _, t := range f.Tenants {
			if t == m.Tenant {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	code := ""
	if m.LastError != nil {
		code = m.LastError.Code
	}
	switch {
	case f.Status != "" && m.Status != f.Status,
		f.Topic != "" && m.Topic != f.Topic,
		f.Group != "" && m.Group != f.Group,
		f.ErrorCode != "" && code != f.ErrorCode,
		!f.CreatedAfter.IsZero() && m.CreatedAt.Before(f.CreatedAfter),
		!f.CreatedBefore.IsZero() && !m.CreatedAt.Before(f.CreatedBefore):
		return false
	}
	return true
}

// MessageSearchParams filters and pages an operator listing.
type MessageSearchParams struct {
	Filter MessageFilter
	// AfterSeq continues a listing: pass the previous page's NextAfterSeq.
	AfterSeq int64
	// Limit defaults to 100, at most 1000.
	Limit int
}

// MessageRequeueManyParams selects dead letters to requeue.
type MessageRequeueManyParams struct {
	// Filter selects the messages; its Status must be FAILED or empty
	// (only FAILED messages are requeued either way).
	Filter MessageFilter
	// All must be true when Filter is zero: requeueing every dead letter
	// is never an accident.
	All bool
	// DryRun counts what would be requeued and changes nothing.
	DryRun bool
	// AfterSeq continues a bulk requeue: pass the previous call's
	// NextAfterSeq.
	AfterSeq int64
	// Limit is the chunk size: at most this many messages per call (one
	// transaction). Defaults to 500, at most 1000.
	Limit int
	Now   time.Time
}

// RequeueManyResult is what one MessageRequeueMany call did.
type RequeueManyResult struct {
	// Matched is how many FAILED messages of this chunk matched.
	Matched int
	// Requeued is how many were moved to PENDING (0 on a dry run).
	Requeued int
	// IDs are the matched messages' IDs, in Seq order.
	IDs []string
	// NextAfterSeq is the AfterSeq of the next chunk; 0 when this was the
	// last.
	NextAfterSeq int64
}

// Prepare checks p and applies its defaults (Limit 500, Now the current
// time in UTC, Filter.Status FAILED); stores call it at the entry of
// MessageRequeueMany and work on p as it leaves it.
func (p *MessageRequeueManyParams) Prepare() error {
	if err := p.Filter.Validate(); err != nil {
		return err
	}
	if p.Filter.Status != "" && p.Filter.Status != StatusFailed {
		return invalid("Filter.Status", fmt.Sprintf("only FAILED messages can be requeued, not %s", p.Filter.Status))
	}
	if p.Filter.IsZero() && !p.All {
		return invalid("Filter", "is empty: set All to requeue every dead letter")
	}
	if p.Limit < 0 || p.Limit > 1000 {
		return invalid("Limit", "must be between 0 and 1000")
	}
	if p.Limit == 0 {
		p.Limit = 500
	}
	if p.AfterSeq < 0 {
		return invalid("AfterSeq", "is negative")
	}
	if p.Now.IsZero() {
		p.Now = time.Now()
	}
	p.Now = p.Now.UTC()
	p.Filter.Status = StatusFailed
	return nil
}

// Prepare checks p and applies its defaults (Limit 100); stores call it at
// the entry of MessageSearch and work on p as it leaves it.
func (p *MessageSearchParams) Prepare() error {
	if err := p.Filter.Validate(); err != nil {
		return err
	}
	if p.Limit < 0 || p.Limit > 1000 {
		return invalid("Limit", "must be between 0 and 1000")
	}
	if p.Limit == 0 {
		p.Limit = 100
	}
	if p.AfterSeq < 0 {
		return invalid("AfterSeq", "is negative")
	}
	return nil
}

// RequeueAll runs MessageRequeueMany chunk by chunk until every match was
// handled or ctx ends, calling progress (if not nil) after each chunk. It
// returns the totals; on an error the chunks before it stay done, and the
// returned NextAfterSeq resumes the run.
func RequeueAll(ctx context.Context, a Admin, p MessageRequeueManyParams, progress func(RequeueManyResult)) (RequeueManyResult, error) {
	var total RequeueManyResult
	for {
		if err := ctx.Err(); err != nil {
			total.NextAfterSeq = p.AfterSeq
			return total, err
		}
		r, err := a.MessageRequeueMany(ctx, p)
		if err != nil {
			total.NextAfterSeq = p.AfterSeq
			return total, err
		}
		total.Matched += r.Matched
		total.Requeued += r.Requeued
		total.IDs = append(total.IDs, r.IDs...)
		if progress != nil {
			progress(r)
		}
		if r.NextAfterSeq == 0 {
			total.NextAfterSeq = 0
			return total, nil
		}
		p.AfterSeq = r.NextAfterSeq
	}
}

// Pause stops the claiming of a topic, or of one group of it.
type Pause struct {
	Topic string
	// Group is the paused group; "" pauses the whole topic.
	Group string
	// Tenant limits the pause to one tenant; "" pauses every tenant.
	Tenant    string
	CreatedAt time.Time
}

// Matches reports whether the pause covers m.
func (p Pause) Matches(m *Message) bool {
	return p.Topic == m.Topic && (p.Group == "" || p.Group == m.Group) && (p.Tenant == "" || p.Tenant == m.Tenant)
}

// PauseAddParams names what to pause.
type PauseAddParams struct {
	Topic, Group, Tenant string
	Now                  time.Time
}

// PauseListParams is empty; it exists so fields can be added.
type PauseListParams struct{}

// PauseRemoveParams names the pause to remove.
type PauseRemoveParams struct {
	Topic, Group, Tenant string
}

// Validate checks the names of the pause: a Topic, and no name longer than
// MaxKeyLength.
func (p PauseAddParams) Validate() error { return validatePause(p.Topic, p.Group, p.Tenant) }

// Validate checks the names of the pause, as PauseAddParams.Validate.
func (p PauseRemoveParams) Validate() error { return validatePause(p.Topic, p.Group, p.Tenant) }

func validatePause(topic, group, tenant string) error {
	if topic == "" {
		return invalid("Topic", "is required")
	}
	for _, s := range []string{topic, group, tenant} {
		if len(s) > MaxKeyLength {
			return invalid("Pause", fmt.Sprintf("a name is %d bytes, the limit is %d", len(s), MaxKeyLength))
		}
	}
	return nil
}

// TopicStatsParams scopes TopicStats.
type TopicStatsParams struct {
	// Tenants restricts the stats to these tenants; empty means every
	// tenant.
	Tenants []string
}

// TopicStat is one topic's counts.
type TopicStat struct {
	Topic string
	// Counts has every status, possibly 0.
	Counts map[Status]int64
	// OldestPendingAt is the CreatedAt of the oldest PENDING message; zero
	// when none is PENDING.
	OldestPendingAt time.Time
}

// OldestPendingAge is now - OldestPendingAt, or 0 when nothing is PENDING.
func (s TopicStat) OldestPendingAge(now time.Time) time.Duration {
	if s.OldestPendingAt.IsZero() {
		return 0
	}
	return max(now.Sub(s.OldestPendingAt), 0)
}

// ErrNotAdmin is returned by tools given a store that does not implement
// Admin.
var ErrNotAdmin = errors.New("outbox: the store does not implement outbox.Admin")
