package outbox

import (
	"context"
	"time"
)

// lease is the processor's record of one claim it holds, from the claim
// until its outcome is written.
type lease struct {
	topic, id string
	attempt   int
	// token and claimedAt are the claim's ClaimToken and ClaimedAt as the
	// store returned them: they tell two claims of the same message apart
	// (a lease lost during a long store outage and claimed again by this
	// processor). The token does on every store that issues one; claimedAt
	// is what a store without tokens leaves to go by.
	token     string
	claimedAt time.Time
	// renewed is when the lease was taken or last extended (processor
	// clock); lost is set when the store reported it lost. Both are
	// guarded by Processor.leaseMu.
	renewed time.Time
	lost    bool
	// writing is set once the recorder has taken the lease's outcome into
	// a MessageFinish call (guarded by Processor.leaseMu). A claim of the
	// same message while it is set may have come before or after that
	// write commits; see hold.
	writing bool
	// out and outErr are the outcome written under the lease (and the
	// publisher's error behind it), and refused reports that the store
	// refused it (lease lost), all set by the recorder (guarded by
	// Processor.leaseMu): a later claim of the message that was released
	// because of this write records that outcome instead (see hold).
	out     *Outcome
	outErr  error
	refused bool
}

func leaseKey(m *Message) string { return keyOf(m.Topic, m.ID) }

// of reports whether l is the lease of m's claim (not of an earlier or
// later claim of the same message).
func (l *lease) of(m *Message) bool {
	return l.token == m.ClaimToken && l.claimedAt.Equal(m.ClaimedAt)
}

func keyOf(topic, id string) string { return topic + "\x00" + id }

// hold registers the leases of a claim taken at now. It returns the
// indexes in msgs of the messages to release at once, unpublished, each
// with the earlier lease whose outcome is being written.
//
// A claim can return a message this processor still holds an earlier lease
// of: that lease expired (a store stall longer than ProcessingTimeout) and
// was recovered, which gives the attempt back, so both leases have the same
// owner and attempt. A store fences outcomes by the claim token too (see
// Message.ClaimToken), so the earlier lease's outcome is refused there; a
// store that issues no token cannot tell the two leases apart, and the
// earlier lease's outcome must then not reach it after this claim: it
// would finish the new lease (a Released one would put the message back
// to PENDING while it is published again, and another processor could claim
// it and the rest of its group). So the new lease replaces the earlier one
// here, and the recorder leaves out the outcomes of a lease that is no
// longer the one held (see record). When that outcome is being written
// already, it may commit before this claim or after it (then, without
// tokens, it finishes this lease): the message is released under the new
// lease, after that write (the recorder writes in order), which either
// puts it back to PENDING or is refused because that write finished the
// lease. When the store refused that write instead (the claim token
// told the leases apart), the recorder records the earlier lease's
// outcome under the new lease in place of the release (see record): the
// message was published, and is not published again.
func (p *Processor) hold(msgs []Message, now time.Time) (release map[int]*lease) {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	for i := range msgs {
		m := &msgs[i]
		k := leaseKey(m)
		if old := p.leases[k]; old != nil && old.writing {
			if release == nil {
				release = map[int]*lease{}
			}
			release[i] = old
		}
		p.leases[k] = &lease{topic: m.Topic, id: m.ID, attempt: m.Attempts, token: m.ClaimToken, claimedAt: m.ClaimedAt, renewed: now}
	}
	return release
}

// holds reports whether the processor still holds m's lease at now: not
// reported lost by the store, renewed less than ProcessingTimeout ago, and
// not replaced by a newer claim of the same message.
func (p *Processor) holds(m Message, now time.Time) bool {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	l := p.leases[leaseKey(&m)]
	if l == nil || !l.of(&m) {
		return false
	}
	return !l.lost && now.Sub(l.renewed) < p.cfg.ProcessingTimeout
}

// forget drops m's lease (one it no longer publishes under).
func (p *Processor) forget(m Message) {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	k := leaseKey(&m)
	if l := p.leases[k]; l != nil && l.of(&m) {
		delete(p.leases, k)
	}
}

// forgetLeases drops the leases an outcome was written under, and only
// those: once the outcome is committed, a message it made due again (a
// retry, a release) may already be claimed again by this processor, and
// that claim's lease must stay. ClaimedAt alone does not tell the two
// claims apart on a store whose clock is coarse (whole seconds for
// seedstore on MySQL).
func (p *Processor) forgetLeases(ls []*lease) {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	for _, l := range ls {
		if l == nil {
			continue
		}
		k := keyOf(l.topic, l.id)
		if p.leases[k] == l {
			delete(p.leases, k)
		}
	}
}

// heartbeatEvery is how often the processor extends its leases: each held
// lease is renewed when it is between one and two of these old, far from
// ProcessingTimeout.
func (p *Processor) heartbeatEvery() time.Duration {
	return max(p.cfg.ProcessingTimeout/4, time.Millisecond)
}

// startHeartbeat starts extending the leases the processor holds, when the
// store is a LeaseExtender, and returns the function that stops it. Without
// one it warns that ProcessingTimeout must cover the longest publish.
func (p *Processor) startHeartbeat(ctx context.Context) (stop func()) {
	ext, ok := p.store.(LeaseExtender)
	if !ok {
		p.log.Warn("the store cannot extend leases: Config.ProcessingTimeout must exceed the longest publish "+
			"(and any store stall while outcomes are written), or messages held longer are recovered and published again",
			"processing_timeout", p.cfg.ProcessingTimeout)
		return func() {}
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		every := p.heartbeatEvery()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			p.extendLeases(hctx, ext, every)
		}
	}()
	return func() { cancel(); <-done }
}

// extendLeases renews every held lease older than age. A lease older than
// ProcessingTimeout is not renewed (it may have been recovered and claimed
// again: its message is not published by this processor); a lease the
// store reports lost is marked so.
func (p *Processor) extendLeases(ctx context.Context, ext LeaseExtender, age time.Duration) {
	now := p.cfg.Clock.Now()
	var due []*lease
	p.leaseMu.Lock()
	for _, l := range p.leases {
		if !l.lost && now.Sub(l.renewed) >= age && now.Sub(l.renewed) < p.cfg.ProcessingTimeout {
			due = append(due, l)
		}
	}
	p.leaseMu.Unlock()
	const chunk = 1000
	for len(due) > 0 {
		n := min(len(due), chunk)
		part := due[:n]
		due = due[n:]
		params := MessageExtendLeaseParams{Owner: p.cfg.ID, Leases: make([]Lease, n)}
		for i, l := range part {
			params.Leases[i] = Lease{Topic: l.topic, ID: l.id, Attempt: l.attempt, ClaimToken: l.token}
		}
		cctx, cancel := context.WithTimeout(ctx, max(p.cfg.ProcessingTimeout/2, time.Second))
		res, extendedAt, err := p.extend(cctx, ext, params)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("extending leases failed; retrying at the next heartbeat", "err", err, "messages", n)
			}
			continue
		}
		lost := make(map[string]bool, len(res.LeaseLost))
		for _, id := range res.LeaseLost {
			lost[id] = true
		}
		p.leaseMu.Lock()
		for _, l := range part {
			if lost[l.id] {
				l.lost = true
			} else {
				l.renewed = extendedAt
			}
		}
		p.leaseMu.Unlock()
	}
}

// slotExtender is a store whose calls may wait for a slot before they
// reach the database, as slotClaimer. extendInSlot reads the extension's
// Now from now once it holds the slot, and returns it.
type slotExtender interface {
	extendInSlot(ctx context.Context, p MessageExtendLeaseParams, now func() time.Time) (ExtendLeaseResult, time.Time, error)
}

// extend extends p's leases to p.Now, read from the processor's clock as
// the call reaches the store, and returns it. Not before a slot was waited
// for (see claim): the leases of an extension that waited for one started
// again as long before as it waited, so that a few such waits in a row
// let recovery take messages being published.
func (p *Processor) extend(ctx context.Context, ext LeaseExtender, params MessageExtendLeaseParams) (ExtendLeaseResult, time.Time, error) {
	if s, ok := ext.(slotExtender); ok {
		return s.extendInSlot(ctx, params, p.cfg.Clock.Now)
	}
	params.Now = p.cfg.Clock.Now()
	res, err := ext.MessageExtendLease(ctx, params)
	return res, params.Now, err
}

// addUnrecorded counts published messages whose outcomes wait to be
// written (n > 0) or were written (n < 0).
func (p *Processor) addUnrecorded(n int) {
	if n == 0 {
		return
	}
	p.unrecMu.Lock()
	p.unrecorded += n
	if n < 0 {
		close(p.recorded)
		p.recorded = make(chan struct{})
	}
	p.unrecMu.Unlock()
}

// awaitRecorder waits until fewer than Config.MaxUnrecordedOutcomes
// published messages wait for their outcomes to be written, so a crash
// publishes again at most those and the batches being published. It
// returns false when the processor is stopping.
func (p *Processor) awaitRecorder() bool {
	for {
		p.unrecMu.Lock()
		if p.unrecorded < p.cfg.MaxUnrecordedOutcomes {
			p.unrecMu.Unlock()
			return true
		}
		ch := p.recorded
		p.unrecMu.Unlock()
		select {
		case <-ch:
		case <-p.stopping:
			return false
		}
	}
}
