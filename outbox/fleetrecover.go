package outbox

import (
	"context"
	"time"
)

// OrphanRecoverer is an optional Store capability a Fleet uses when it takes
// a database from an instance whose lease ended (it died, or was cut off
// and stopped): the messages that instance had claimed go back to PENDING
// at once, instead of waiting up to ProcessingTimeout for their message
// leases to expire and a recovery pass to run. store/postgres implements
// it, on both its paths.
//
// It is safe only when no processor works the store: the Fleet calls it
// after it took the database's lease (a new Epoch, so the previous
// holder's lease ended and that holder stopped its processor before the
// lease could expire) and before the database's processor starts (again
// before each retry of a processor that could not start). A late outcome of the previous holder is then refused by the
// store's fence: the recovery clears each message's claim token, and a new
// claim gives it another.
type OrphanRecoverer interface {
	// MessageRecoverOrphans is MessageRecover for every PROCESSING message,
	// whenever it was claimed and by whom: each goes back to PENDING without
	// counting the lost attempt and with one more recovery (a dead letter
	// when its recoveries reach MaxRecoveries, as MessageRecover does), its
	// claim token cleared. FIFO per group holds as after MessageRecover: a
	// recovered message is claimed again before the later messages of its
	// group. A store may leave the leases taken long ago (past any
	// ProcessingTimeout in use) to MessageRecover, when finding them costs
	// it more: they have expired anyway.
	MessageRecoverOrphans(ctx context.Context, p MessageRecoverOrphansParams) (RecoverResult, error)
}

// MessageRecoverOrphansParams is MessageRecoverParams without ClaimedBefore:
// every lease is recovered.
type MessageRecoverOrphansParams struct {
	// Now stamps the recovery.
	Now time.Time
	// MaxRecoveries is how many recoveries dead-letter a message; 0 means
	// DefaultMaxRecoveries.
	MaxRecoveries int
	// MaxAttempts is as in MessageRecoverParams.
	MaxAttempts int
	// DeadLetter says which of the messages dead-lettered here block their
	// group (see DeadLetterRule.Blocks).
	DeadLetter DeadLetterRule
}

// Validate checks that MaxRecoveries and MaxAttempts are not negative and
// DeadLetter is valid.
func (p MessageRecoverOrphansParams) Validate() error {
	return p.RecoverParams().Validate()
}

// RecoverParams returns the MessageRecoverParams that recover every lease
// as p does: ClaimedBefore is far in the future (the year 9999), since a
// claim's time is its processor's clock, which may be ahead of this one's.
// A store whose MessageRecover keeps no state between calls implements
// MessageRecoverOrphans with it.
func (p MessageRecoverOrphansParams) RecoverParams() MessageRecoverParams {
	return MessageRecoverParams{
		ClaimedBefore: orphanCutoff, Now: p.Now, MaxRecoveries: p.MaxRecoveries,
		MaxAttempts: p.MaxAttempts, DeadLetter: p.DeadLetter,
	}
}

var orphanCutoff = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// recoverOrphans gives back at once the message leases left in sh's
// database (see OrphanRecoverer) before its processor starts: those of the
// previous holder of the lease, and on a retry those of this instance's
// processor that could not start (Processor.Run returned, so nothing works
// them either). Only a lease that followed another (Epoch above 1) does
// it: the first lease of a database may follow processors that ran
// outside the fleet, which nothing stopped. A failure is logged and left
// to the processor's lease recovery.
func (f *Fleet) recoverOrphans(ctx context.Context, sh *fleetShard, fs *fleetStore) {
	r, ok := fs.Store.(OrphanRecoverer)
	if !ok || sh.lease.Epoch <= 1 {
		return
	}
	cfg := f.cfg.Processor.WithDefaults()
	if err := fs.enter(ctx); err != nil {
		return
	}
	res, err := r.MessageRecoverOrphans(ctx, MessageRecoverOrphansParams{
		Now: cfg.Clock.Now(), MaxRecoveries: cfg.MaxRecoveries, MaxAttempts: cfg.MaxAttempts, DeadLetter: cfg.DeadLetter,
	})
	fs.leave()
	switch {
	case err != nil && ctx.Err() == nil:
		f.log.Warn("recovering the previous holder's leases failed; they wait for their expiry",
			"database", sh.name, "epoch", sh.lease.Epoch, "err", err)
	case res.Recovered > 0 || res.DeadLettered > 0:
		f.log.Info("recovered the previous holder's leases", "database", sh.name, "epoch", sh.lease.Epoch,
			"recovered", res.Recovered, "dead_lettered", res.DeadLettered)
	}
}

// leaseLimit is how long after its last renewal a lease counts as lost to
// this instance, whatever its renewal rounds are doing: the processor is
// stopped then (watchLease) and publishes nothing more (leasePublisher).
// The rounds' own check stops it after LeaseTTL/2, but each of a round's
// calls may take LeaseTTL/4, so that check may come late. With
// DrainTimeout at most LeaseTTL/4 the processor has stopped by 7/8 of
// LeaseTTL, before the lease can expire (it counts, on the coordination
// store's clock, from a moment after the one this instance recorded), which
// the next holder's recovery (OrphanRecoverer) relies on.
func (f *Fleet) leaseLimit() time.Duration { return f.cfg.LeaseTTL * 5 / 8 }

// leasePublisher is the Publisher of sh's processor: it publishes only
// while sh's lease is fresh (renewed less than leaseLimit ago, by this
// process's monotonic clock), else returns ErrNotAttempted for the batch.
// watchLease stops the processor then, but a process that was paused (a
// stopped VM, a long GC pause) may reach Publish before its timers run:
// its lease may have expired meanwhile, and the instance that took the
// database may have recovered the messages at once (OrphanRecoverer), so
// publishing them would duplicate them and could reorder their groups.
func (f *Fleet) leasePublisher(sh *fleetShard) Publisher {
	return PublisherFunc(func(ctx context.Context, msgs []Message) []Result {
		f.mu.Lock()
		fresh := time.Since(sh.renewedAt) < f.leaseLimit()
		f.mu.Unlock()
		if !fresh {
			res := make([]Result, len(msgs))
			for i := range res {
				res[i].Err = ErrNotAttempted
			}
			return res
		}
		return f.cfg.Publisher.Publish(ctx, msgs)
	})
}

// watchLease stops sh's processor once its lease went leaseLimit without
// renewal; until then it re-arms itself.
func (f *Fleet) watchLease(sh *fleetShard) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sh.stopping {
		return
	}
	left := f.leaseLimit() - time.Since(sh.renewedAt)
	if left <= 0 {
		f.stopLocked(sh, "its lease went unrenewed for 5/8 of LeaseTTL")
		return
	}
	sh.watch.Reset(left)
}
