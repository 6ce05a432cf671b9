package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Errors Run returns when it cannot start.
var (
	// ErrNotMigrated: the store's tables do not exist. Call the store's
	// Migrate (or apply its migrations) before Run.
	ErrNotMigrated = errors.New("outbox: the store's tables are missing: call the store's Migrate before Run")
	// ErrStoreUnavailable: the store did not answer (wrong DSN, database
	// down, no permission).
	ErrStoreUnavailable = errors.New("outbox: the store is unavailable")
)

// startProbeTimeout bounds the store probe Run makes before it starts.
const startProbeTimeout = 30 * time.Second

// probe reads one message to learn whether the store answers and its
// tables exist.
func (p *Processor) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, startProbeTimeout)
	defer cancel()
	var err error
	if pg, ok := p.store.(Pinger); ok {
		err = pg.Ping(pctx)
	} else {
		_, err = p.store.MessageList(pctx, MessageListParams{Limit: 1})
	}
	return startErr(err)
}

// startErr is the error Run returns when its probe (or the first claim
// that stands for it) failed with err: one matching ErrNotMigrated or
// ErrStoreUnavailable; nil when err is.
func startErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotMigrated) || missingTable(err):
		return fmt.Errorf("outbox: cannot start: %w (%w)", ErrNotMigrated, err)
	default:
		return fmt.Errorf("outbox: cannot start: %w: %w", ErrStoreUnavailable, err)
	}
}

// missingTable recognises the missing-table errors of the SQL databases the
// stores support (PostgreSQL SQLSTATE 42P01, MySQL/MariaDB error 1146,
// SQLite), for stores that do not wrap ErrNotMigrated themselves.
func missingTable(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "no such table") || // sqlite
		strings.Contains(s, "42p01") || // postgres undefined_table
		(strings.Contains(s, "relation") && strings.Contains(s, "does not exist")) ||
		strings.Contains(s, "error 1146") || // mysql/mariadb
		(strings.Contains(s, "table") && strings.Contains(s, "doesn't exist"))
}

// errorBackoff is the wait after the n-th consecutive store failure:
// PollInterval doubled n times, at most max (and never below base).
func errorBackoff(base, maxWait time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d < maxWait; i++ {
		d *= 2
	}
	return max(base, min(d, maxWait))
}

// Health is a processor's view of itself, for liveness and readiness
// checks. See Processor.Health.
type Health struct {
	// Running reports that Run has started (its store probe passed) and
	// has not returned.
	Running bool
	// Healthy reports that Run is running and its last store call (claim or
	// outcome recording) succeeded.
	Healthy bool
	// Err is the last store error, nil once a later call succeeded.
	Err error
	// ConsecutiveFailures counts the store calls that failed since the last
	// success.
	ConsecutiveFailures int
	// Since is when Healthy last changed.
	Since time.Time
}

// Health returns the processor's health: whether Run is running and whether
// the store answers. A readiness endpoint can serve it:
//
//	if h := p.Health(); !h.Healthy { http.Error(w, fmt.Sprint(h.Err), 503) }
func (p *Processor) Health() Health {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	h := p.health
	h.Healthy = h.Running && h.Err == nil
	return h
}

// setHealth records the result of a store call: err == nil is a success.
func (p *Processor) setHealth(err error) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	was := p.health.Running && p.health.Err == nil
	if err == nil {
		p.health.Err = nil
		p.health.ConsecutiveFailures = 0
	} else {
		p.health.Err = err
		p.health.ConsecutiveFailures++
	}
	p.healthChangedLocked(was)
}

// setRunning records that Run started or returned.
func (p *Processor) setRunning(running bool) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	was := p.health.Running && p.health.Err == nil
	p.health.Running = running
	p.healthChangedLocked(was)
}

func (p *Processor) healthChangedLocked(was bool) {
	if now := p.health.Running && p.health.Err == nil; now != was || p.health.Since.IsZero() {
		p.health.Since = p.cfg.Clock.Now()
	}
}

// Progress counts what a processor did since it was created, for
// dashboards and for programs that wait for work to finish.
type Progress struct {
	// InFlight is the number of claimed messages held in memory
	// (publishing or waiting for their group).
	InFlight int64
	// Claimed counts the messages claimed; Sent, Retried, DeadLettered and
	// Released count the outcomes reached (Released: handed back without
	// an attempt counted, e.g. deferred or at shutdown).
	Claimed, Sent, Retried, DeadLettered, Released int64
	// Unrouted lists the topics that had messages due for longer than
	// Config.UnroutedAfter at the last check, none of which this processor
	// claims: unless another processor claims them, nothing will publish
	// them. Nil when the store cannot list them (see PendingTopicLister)
	// or Config.AllTopics is set.
	Unrouted []PendingTopic
	// UnroutedCheckedAt is when Unrouted was last computed (zero: never).
	UnroutedCheckedAt time.Time
}

// Progress returns the processor's counters.
func (p *Processor) Progress() Progress {
	p.stateMu.Lock()
	un := slices.Clone(p.unrouted)
	at := p.checked
	p.stateMu.Unlock()
	return Progress{
		InFlight: p.inflight.Load(),
		Claimed:  p.counters.claimed.Load(), Sent: p.counters.sent.Load(),
		Retried: p.counters.retried.Load(), DeadLettered: p.counters.dead.Load(),
		Released: p.counters.released.Load(),
		Unrouted: un, UnroutedCheckedAt: at,
	}
}

// WaitDrained returns nil once the running processor has found nothing due
// to claim, for its topics, with nothing in flight, in a claim started after
// the call: everything that was due is published, dead-lettered or waiting
// for a later retry time (WaitDrained does not wait for retries scheduled in
// the future, nor for messages of topics the processor does not claim). It
// wakes the poller rather than waiting for the poll interval. It returns
// ctx's error when ctx ends first; a processor that is not running or not
// the leader never drains.
func (p *Processor) WaitDrained(ctx context.Context) error {
	p.stateMu.Lock()
	start := p.pollSeq
	p.stateMu.Unlock()
	for {
		p.stateMu.Lock()
		done := p.idleSeq > start
		ch := p.polled
		p.stateMu.Unlock()
		if done {
			return nil
		}
		if p.inflight.Load() == 0 {
			p.Wake()
		}
		t := time.NewTimer(p.cfg.PollInterval)
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// pollDone records the end of poll seq; idle reports that it found nothing
// due.
func (p *Processor) pollDone(seq int64, idle bool) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if idle && p.inflight.Load() == 0 && seq > p.idleSeq {
		p.idleSeq = seq
	}
	p.broadcastLocked()
}

// broadcastLocked wakes every WaitDrained. p.stateMu must be held.
func (p *Processor) broadcastLocked() {
	close(p.polled)
	p.polled = make(chan struct{})
}

// PendingTopicLister is an optional Store capability the processor uses to
// report topics nobody publishes: the topics (across tenants) that have
// PENDING messages due before DueBefore.
type PendingTopicLister interface {
	MessagePendingTopics(ctx context.Context, p MessagePendingTopicsParams) ([]PendingTopic, error)
}

// MessagePendingTopicsParams selects the messages MessagePendingTopics
// counts: PENDING, due at or before DueBefore, in every tenant.
type MessagePendingTopicsParams struct {
	DueBefore time.Time
	// ExcludeTopics are topics the caller does not need counted (the
	// processor passes the topics it claims, and filters the result
	// itself). A store may leave them out, and so skip reading their
	// messages: with a backlog of a claimed topic, counting it is the whole
	// cost of the call. A store may also return them.
	ExcludeTopics []string
}

// PendingTopic is one topic with PENDING messages.
type PendingTopic struct {
	Topic string
	// Messages is the number of PENDING messages due at or before
	// DueBefore, across tenants.
	Messages int64
	// OldestDueAt is the earliest NextAttemptAt among them.
	OldestDueAt time.Time
}

// checkUnrouted lists the topics whose messages have waited longer than
// UnroutedAfter and that this processor does not claim, and warns about
// each.
func (p *Processor) checkUnrouted(ctx context.Context) {
	l, ok := p.store.(PendingTopicLister)
	if !ok || p.cfg.AllTopics {
		return
	}
	now := p.cfg.Clock.Now()
	topics, err := l.MessagePendingTopics(ctx, MessagePendingTopicsParams{
		DueBefore: now.Add(-p.cfg.UnroutedAfter), ExcludeTopics: p.cfg.Topics,
	})
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("listing pending topics failed", "err", err)
		}
		return
	}
	var un []PendingTopic
	for _, t := range topics {
		if !slices.Contains(p.cfg.Topics, t.Topic) {
			un = append(un, t)
			p.log.Warn("topic has messages that no processor claims: route it (Router.Handle) in some processor, or cancel them",
				"topic", t.Topic, "messages", t.Messages, "oldest_due_at", t.OldestDueAt, "claimed_topics", p.cfg.Topics)
		}
	}
	p.stateMu.Lock()
	p.unrouted, p.checked = un, now
	p.stateMu.Unlock()
}
