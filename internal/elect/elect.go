// Package elect is what the stores' Electors share: the defaults of their
// options, the leader's term (the lead function run beside a periodic check
// of the leadership) and a sleep that ends with its context. Each store
// keeps how it takes, checks and lets go of the leadership (a lock, a lease
// document, an in-process key).
package elect

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"
)

// Defaults of every store's ElectorOptions.
const (
	DefaultName          = "processor"
	DefaultRetryInterval = 5 * time.Second
	DefaultCheckInterval = 2 * time.Second
)

// MinCheckTimeout is the least time a leader's check of its leadership
// waits for the database (the SQL stores wait up to CheckInterval or this,
// whichever is longer): a check cut off ends the leadership, and a slow
// moment should not.
const MinCheckTimeout = 5 * time.Second

// Default sets the zero options of an ElectorOptions to their defaults.
func Default(name *string, retry, check *time.Duration) {
	if *name == "" {
		*name = DefaultName
	}
	if *retry <= 0 {
		*retry = DefaultRetryInterval
	}
	if *check <= 0 {
		*check = DefaultCheckInterval
	}
}

// Hold is the lead function of an Elector run without one: it holds the
// leadership until the term ends (for outbox.Config.Leader).
func Hold(ctx context.Context) { <-ctx.Done() }

// Sleep sleeps for d or until ctx ends; it reports whether ctx is still
// alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ErrLapsed ends a term whose Deadline passed before a check pushed it back.
var ErrLapsed = errors.New("the leadership lapsed before it was renewed")

// Term is one leader's term, as a store runs it.
type Term struct {
	// Leader is the Elector's IsLeader flag: true while the term lasts.
	Leader *atomic.Bool
	// Log receives "became leader" and "stepped down", prefixed by Prefix
	// (e.g. "outboxkit/mysql") and with Attrs.
	Log    *slog.Logger
	Prefix string
	Attrs  []any
	// Every is how often Check runs.
	Every time.Duration
	// Check checks the leadership; an error ends the term at once (Check
	// logs why). A check that cannot tell (a transient error) logs and
	// returns nil.
	Check func(ctx context.Context) error
	// Deadline, when set, is when the term must end unless a check pushed
	// it back: it is read at the start and after every check.
	Deadline func() time.Time
}

// Run runs lead(lctx) for the term: lctx ends when ctx ends, when a check
// fails or the deadline passes (lead returning ends the term too). Run
// waits for lead to return and reports what ended the term: nil for ctx or
// lead, ErrLapsed for the deadline, else the check's error.
func (t Term) Run(ctx context.Context, lead func(ctx context.Context)) error {
	t.Leader.Store(true)
	t.Log.InfoContext(ctx, t.Prefix+": became leader", t.Attrs...)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(lctx)
	}()
	tick := time.NewTicker(t.Every)
	defer tick.Stop()
	var lapse <-chan time.Time
	var timer *time.Timer
	if t.Deadline != nil {
		timer = time.NewTimer(time.Until(t.Deadline()))
		defer timer.Stop()
		lapse = timer.C
	}
	var err error
watch:
	for {
		select {
		case <-ctx.Done():
			break watch
		case <-done:
			break watch
		case <-lapse:
			t.Log.WarnContext(ctx, t.Prefix+": leader could not renew in time, stepping down", t.Attrs...)
			err = ErrLapsed
			break watch
		case <-tick.C:
			if err = t.Check(ctx); err != nil {
				break watch
			}
			if timer != nil {
				timer.Reset(time.Until(t.Deadline()))
			}
		}
	}
	t.Leader.Store(false)
	cancel()
	<-done
	t.Log.InfoContext(context.WithoutCancel(ctx), t.Prefix+": stepped down", t.Attrs...)
	return err
}
