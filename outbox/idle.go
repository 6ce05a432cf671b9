package outbox

import (
	"context"
	"slices"
	"sync"
	"time"
)

// maxDues bounds the due times a processor keeps of the retries and
// deferrals it wrote (see Config.IdlePollInterval).
const maxDues = 1024

// dueTimes are the times at which messages this processor gave back to
// the store (retries, deferrals) become due: an idle processor whose
// store's wake-ups are live wakes for them, as nothing notifies it then.
type dueTimes struct {
	mu sync.Mutex
	at []time.Time // sorted, at most maxDues
}

// add keeps at; when maxDues are kept already, the latest is dropped.
func (d *dueTimes) add(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, _ := slices.BinarySearchFunc(d.at, at, time.Time.Compare)
	if i == maxDues {
		return
	}
	d.at = slices.Insert(d.at, i, at)
	if len(d.at) > maxDues {
		d.at = d.at[:maxDues]
	}
}

// next drops the due times not after now and returns the earliest of the
// others, if any.
func (d *dueTimes) next(now time.Time) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, _ := slices.BinarySearchFunc(d.at, now, func(a, b time.Time) int {
		if a.After(b) {
			return 1
		}
		return -1
	})
	d.at = d.at[i:]
	if len(d.at) == 0 {
		return time.Time{}, false
	}
	return d.at[0], true
}

// idling reports that the processor may wait IdlePollInterval between
// claims when its store's wake-ups are live.
func (p *Processor) idling() bool { return p.cfg.IdlePollInterval > p.cfg.PollInterval }

// wakeups starts the store's wake-ups, if it has them, and returns the
// function that tells whether they are live (nil when the store cannot
// tell: never).
func (p *Processor) wakeups(ctx context.Context) (<-chan struct{}, func() bool) {
	switch w := p.store.(type) {
	case LiveWaker:
		return w.WakeupsLive(ctx)
	case Waker:
		return w.Wakeups(ctx), nil
	}
	return nil, nil
}

// idleDelay is the wait after a claim that found nothing:
// IdlePollInterval while the store's wake-ups are live (live), the
// processor may claim (a Leader's change wakes nothing) and nothing was in
// flight when the claim began (busy: an outcome written during the claim
// may have made the next message of a group claimable, unseen by it), but
// never past the next due time of a retry or deferral this processor
// wrote; PollInterval otherwise.
func (p *Processor) idleDelay(live func() bool, busy bool) time.Duration {
	if !p.idling() || busy || live == nil || !live() || !p.active() {
		return p.cfg.PollInterval
	}
	now := p.cfg.Clock.Now()
	if at, ok := p.dues.next(now); ok {
		return min(p.cfg.IdlePollInterval, max(at.Sub(now), time.Millisecond))
	}
	return p.cfg.IdlePollInterval
}

// noteDue keeps the due time of an outcome written that gives its message
// back for later (a retry, a deferral), when the processor idles.
func (p *Processor) noteDue(o Outcome) {
	if !p.idling() || o.NextAttemptAt.IsZero() || (o.Kind != OutcomeRetry && o.Kind != OutcomeReleased) {
		return
	}
	p.dues.add(o.NextAttemptAt)
}
