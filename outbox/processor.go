package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Processor claims due messages from a Store, publishes them through a
// Publisher and records the outcomes. Several processors (in one process or
// many replicas) may work on the same store: claims are atomic and FIFO per
// group holds across them.
//
// The pipeline: a poller claims at most the free space of a bounded buffer
// (a full buffer leaves messages in the database), a distributor hands each
// message to the worker of its group (tenant, topic, group), one worker per
// active group publishes the group's messages in order, in batches, with at
// most MaxConcurrentGroups groups publishing at once, and a recorder writes
// the outcomes in batches. Unordered messages (group "") are spread over
// MaxConcurrentGroups lanes.
type Processor struct {
	store  Store
	pub    Publisher
	cfg    Config
	log    *slog.Logger
	sem    chan struct{}
	wakeCh chan struct{}

	running atomic.Bool

	mu      sync.Mutex
	groups  map[string]*groupWorker
	workers sync.WaitGroup

	inflight        atomic.Int64 // claimed messages held in memory
	waitingForSpace atomic.Bool

	// dues are the retries and deferrals written, for idleDelay.
	dues dueTimes

	leaseMu sync.Mutex
	leases  map[string]*lease // the leases of the messages held, by leaseKey

	unrecMu    sync.Mutex
	unrecorded int           // published messages whose outcomes are not written yet
	recorded   chan struct{} // closed and replaced when unrecorded drops

	stopping  chan struct{} // closed when Run's ctx ends
	pubCtx    context.Context
	recordCh  chan *finishBatch
	recorders sync.WaitGroup

	stateMu  sync.Mutex
	health   Health
	unrouted []PendingTopic
	checked  time.Time
	polled   chan struct{} // closed and replaced after every poll and when inflight reaches 0
	pollSeq  int64         // polls started
	idleSeq  int64         // the last poll that found nothing due with nothing in flight
	counters struct{ claimed, sent, retried, dead, released atomic.Int64 }
}

// NewProcessor returns a Processor for store and pub with cfg (defaults
// applied, then validated; an invalid Config returns a *ValidationError).
func NewProcessor(store Store, pub Publisher, cfg Config) (*Processor, error) {
	if store == nil {
		return nil, invalid("store", "is nil")
	}
	if pub == nil {
		return nil, invalid("publisher", "is nil")
	}
	if f, ok := pub.(PublisherFunc); ok && f == nil {
		return nil, invalid("publisher", "is a nil PublisherFunc")
	}
	if v, ok := pub.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, err
		}
	}
	cfg = cfg.WithDefaults()
	if err := routedTopics(cfg, pub); err != nil {
		return nil, err
	}
	if len(cfg.Topics) == 0 && !cfg.AllTopics {
		if t, ok := pub.(interface{ Topics() []string }); ok {
			cfg.Topics = t.Topics()
		}
		if len(cfg.Topics) == 0 {
			return nil, invalid("Config.Topics", "is empty and the publisher names no topics: "+
				"list the topics this processor publishes (or register them on a Router), "+
				"or set Config.AllTopics to claim every topic of every tenant")
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkDeadLetterStore(cfg.DeadLetter, store); err != nil {
		return nil, err
	}
	p := &Processor{
		store:  store,
		pub:    pub,
		cfg:    cfg,
		log:    cfg.Logger.With("processor", cfg.ID),
		sem:    make(chan struct{}, cfg.MaxConcurrentGroups),
		wakeCh: make(chan struct{}, 1),
		groups: map[string]*groupWorker{},
		polled: make(chan struct{}),
		leases: map[string]*lease{},

		recorded: make(chan struct{}),
	}
	if r, ok := pub.(*Router); ok {
		r.log.CompareAndSwap(nil, p.log)
	}
	return p, nil
}

// Run runs the processor until ctx ends, then shuts down cleanly: it stops
// claiming, lets in-flight publishes finish for up to Config.DrainTimeout
// (then cancels them; their messages are retried), releases the messages it
// claimed but did not start (back to PENDING, no attempt counted, no lease
// to wait for), records every outcome, and returns nil. Run may be called
// again after it returned.
//
// Before it starts, Run probes the store once (within 30s; Pinger.Ping when
// the store has it, else a one-message MessageList, or, for a Fleet's
// database, its first claim): when the store
// is unreachable it returns an error matching ErrStoreUnavailable, and when
// its tables are missing one matching ErrNotMigrated that says to call the
// store's Migrate. It also returns an error when the processor is already
// running. Once started, store errors do not stop Run: claims back off
// (doubling up to Config.MaxErrorBackoff) and Health reports them.
func (p *Processor) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("outbox: processor is already running")
	}
	defer p.running.Store(false)
	byClaim := p.probesByClaim()
	if !byClaim {
		if err := p.probe(ctx); err != nil {
			return p.cannotStart(ctx, err)
		}
	}

	p.stopping = make(chan struct{})
	pubCtx, cancelPub := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPub()
	p.pubCtx = pubCtx
	p.recordCh = make(chan *finishBatch, p.cfg.MaxConcurrentGroups*2)
	p.recorders.Add(1)
	go p.recordLoop()
	// The heartbeat outlives ctx: it keeps the leases of what is still
	// being published or recorded during the drain.
	stopHeartbeat := p.startHeartbeat(ctx)
	firstPoll := time.Duration(0)
	if byClaim {
		pctx, cancel := context.WithTimeout(ctx, startProbeTimeout)
		again, err := p.pollOnce(pctx)
		cancel()
		if err != nil {
			// Nothing was claimed: nothing to drain.
			close(p.recordCh)
			p.recorders.Wait()
			stopHeartbeat()
			return p.cannotStart(ctx, startErr(err))
		}
		if !again {
			firstPoll = p.cfg.PollInterval
		}
	}
	p.setHealth(nil)
	p.setRunning(true)
	defer p.setRunning(false)

	if p.cfg.AllTopics {
		p.log.Info("outbox processor started", "topics", "all topics", "poll_interval", p.cfg.PollInterval)
	} else {
		p.log.Info("outbox processor started", "topics", p.cfg.Topics, "poll_interval", p.cfg.PollInterval)
	}
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); p.pollLoop(ctx, firstPoll) }()
	go func() { defer loops.Done(); p.recoveryLoop(ctx) }()

	<-ctx.Done()
	close(p.stopping)
	loops.Wait()

	drained := make(chan struct{})
	go func() { p.workers.Wait(); close(drained) }()
	t := time.NewTimer(p.cfg.DrainTimeout)
	select {
	case <-drained:
		t.Stop()
	case <-t.C:
		p.log.Warn("drain timeout: cancelling in-flight publishes", "drain_timeout", p.cfg.DrainTimeout)
		cancelPub()
		<-drained
	}
	close(p.recordCh)
	p.recorders.Wait()
	stopHeartbeat()
	p.log.Info("outbox processor stopped")
	return nil
}

// cannotStart reports err, why Run cannot start, and returns it (nil when
// ctx ended).
func (p *Processor) cannotStart(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	p.setHealth(err)
	p.log.Error("outbox processor cannot start", "err", err)
	return err
}

// claimProber is a store whose processor's first claim may stand for
// Run's start-up probe (fleetStore: a fleet's databases start in turn, and
// the probe was one of the two store calls of a start's turn).
type claimProber interface {
	// probesByClaim reports that the first claim fails as the probe
	// would, when the store is unavailable or not migrated.
	probesByClaim() bool
}

// probesByClaim reports whether Run's first claim is its start-up probe.
func (p *Processor) probesByClaim() bool {
	c, ok := p.store.(claimProber)
	return ok && c.probesByClaim() && p.cfg.Leader == nil
}

// Run creates a Processor and runs it until ctx ends. See Processor.Run.
func Run(ctx context.Context, store Store, pub Publisher, cfg Config) error {
	p, err := NewProcessor(store, pub, cfg)
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// Wake asks the poller to claim now rather than at the next poll interval,
// e.g. right after the application committed new messages. It never blocks.
func (p *Processor) Wake() {
	select {
	case p.wakeCh <- struct{}{}:
	default:
	}
}

// ID returns the processor's ID (Config.ID or its default).
func (p *Processor) ID() string { return p.cfg.ID }

func (p *Processor) active() bool {
	return p.cfg.Leader == nil || p.cfg.Leader.IsLeader()
}

// pollLoop claims messages whenever the timer fires (first after first),
// the store signals new messages, or Wake/free buffer space asks for it.
func (p *Processor) pollLoop(ctx context.Context, first time.Duration) {
	storeWake, live := p.wakeups(ctx)
	timer := time.NewTimer(first)
	defer timer.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case _, ok := <-storeWake:
			if !ok {
				storeWake = nil
				continue
			}
		case <-p.wakeCh:
		}
		busy := p.inflight.Load() > 0
		again, err := p.pollOnce(ctx)
		delay := p.cfg.PollInterval
		switch {
		case err != nil && ctx.Err() == nil:
			failures++
			delay = errorBackoff(p.cfg.PollInterval, p.cfg.MaxErrorBackoff, failures)
			p.setHealth(err)
			p.log.Error("claim failed", "err", err, "consecutive_failures", failures, "retry_in", delay)
		case err != nil:
		case again:
			failures = 0
			delay = 0
			p.setHealth(nil)
		default:
			failures = 0
			p.setHealth(nil)
			delay = p.idleDelay(live, busy)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(delay)
	}
}

// pollOnce claims up to the free buffer space. It returns true when another
// claim should follow at once (the claim was full).
func (p *Processor) pollOnce(ctx context.Context) (again bool, err error) {
	if !p.active() {
		return false, nil
	}
	p.stateMu.Lock()
	p.pollSeq++
	seq := p.pollSeq
	p.stateMu.Unlock()
	claimed := -1
	defer func() { p.pollDone(seq, claimed == 0 && err == nil) }()
	free := p.cfg.BufferSize - int(p.inflight.Load())
	threshold := min(p.cfg.PollBatchSize, max(p.cfg.BufferSize/2, 1))
	if free < threshold {
		p.waitingForSpace.Store(true)
		// re-check: a worker may have freed space before the flag was set
		if p.cfg.BufferSize-int(p.inflight.Load()) < threshold {
			return false, nil
		}
		p.waitingForSpace.Store(false)
		free = p.cfg.BufferSize - int(p.inflight.Load())
	}
	limit := min(free, p.cfg.PollBatchSize)
	start := time.Now()
	msgs, claimedAt, err := p.claim(ctx, MessageClaimParams{Limit: limit, Topics: p.cfg.Topics, Owner: p.cfg.ID})
	if co, ok := p.cfg.Observer.(ClaimObserver); ok {
		co.OnClaimed(ctx, ClaimEvent{Limit: limit, Claimed: len(msgs), Duration: time.Since(start), Err: err})
	}
	if err != nil {
		return false, fmt.Errorf("outbox: claim: %w", err)
	}
	claimed = len(msgs)
	if len(msgs) == 0 {
		return false, nil
	}
	p.counters.claimed.Add(int64(len(msgs)))
	p.inflight.Add(int64(len(msgs)))
	release := p.hold(msgs, claimedAt)
	var released *finishBatch
	if len(release) > 0 {
		// Released with the messages of their groups that follow them in
		// the claim (it holds a group's messages in order): those must not
		// be published before them.
		released = &finishBatch{}
		held := make(map[string]bool)
		kept := msgs[:0:0]
		for i := range msgs {
			m := msgs[i]
			if old, ok := release[i]; ok || (m.Group != "" && held[m.GroupKey()]) {
				if m.Group != "" {
					held[m.GroupKey()] = true
				}
				released.add(m, Outcome{Kind: OutcomeReleased}, nil)
				released.items[len(released.items)-1].inherit = old
				continue
			}
			kept = append(kept, m)
		}
		msgs = kept
		p.log.Warn("claimed messages again while the outcome of their earlier lease is being written; releasing them", "messages", len(released.items))
	}
	// Hand the whole claim over under one lock: a group's messages from one
	// claim must land in the same worker queue. Otherwise a worker could
	// publish message n, fail, release its queue and exit before n+1 is
	// handed over, and a new worker would publish n+1 while n waits for its
	// retry.
	p.mu.Lock()
	for i := range msgs {
		p.dispatchLocked(msgs[i])
	}
	p.mu.Unlock()
	if released != nil {
		// After the write in progress: the recorder takes batches in order.
		p.recordCh <- released
	}
	return claimed == limit, nil
}

// slotClaimer is a store whose calls may wait for a slot before they reach
// the database (fleetStore: a Fleet's store-call budget, shared by all its
// databases). claimInSlot reads the claim's Now from now once it holds the
// slot, and returns it.
type slotClaimer interface {
	claimInSlot(ctx context.Context, p MessageClaimParams, now func() time.Time) ([]Message, time.Time, error)
}

// claim claims with p.Now, the start of the claimed leases (ClaimedAt in
// the store, and the lease clock of hold), read from the processor's
// clock as the claim reaches the store, and returns it. Not before a slot
// was waited for: under overload a fleet's claim waited for one longer
// than ProcessingTimeout, and the messages it then claimed were counted as
// expired leases before they were published (left to recovery, claimed
// and published later).
func (p *Processor) claim(ctx context.Context, params MessageClaimParams) ([]Message, time.Time, error) {
	if s, ok := p.store.(slotClaimer); ok {
		return s.claimInSlot(ctx, params, p.cfg.Clock.Now)
	}
	params.Now = p.cfg.Clock.Now()
	msgs, err := p.store.MessageClaim(ctx, params)
	return msgs, params.Now, err
}

// recoveryLoop recovers expired leases every RecoveryInterval.
func (p *Processor) recoveryLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.RecoveryInterval)
	defer t.Stop()
	for {
		if p.active() {
			now := p.cfg.Clock.Now()
			res, err := p.store.MessageRecover(ctx, MessageRecoverParams{
				ClaimedBefore: now.Add(-p.cfg.ProcessingTimeout), Now: now, MaxAttempts: p.cfg.MaxAttempts, MaxRecoveries: p.cfg.MaxRecoveries,
				DeadLetter: p.cfg.DeadLetter,
			})
			switch {
			case err != nil && ctx.Err() == nil:
				p.log.Error("recovery failed", "err", err)
			case res.Recovered > 0 || res.DeadLettered > 0:
				p.log.Warn("recovered expired leases", "recovered", res.Recovered, "dead_lettered", res.DeadLettered)
				p.Wake()
			}
			p.checkUnrouted(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// groupWorker publishes one group's messages in order.
type groupWorker struct {
	key     string
	ordered bool
	queue   []Message
}

// dispatchLocked queues m on its group's worker, starting one if needed.
// p.mu must be held.
func (p *Processor) dispatchLocked(m Message) {
	key := m.GroupKey()
	ordered := m.Group != ""
	if !ordered {
		h := fnv.New32a()
		_, _ = h.Write([]byte(m.ID))
		key = fmt.Sprintf("%s\x00#%d", key, h.Sum32()%uint32(p.cfg.MaxConcurrentGroups))
	}
	g, ok := p.groups[key]
	if !ok {
		g = &groupWorker{key: key, ordered: ordered}
		p.groups[key] = g
		p.workers.Add(1)
		go p.work(g)
	}
	g.queue = append(g.queue, m)
}

// take removes up to n messages from g's queue; when the queue is empty it
// unregisters g (the worker exits) and returns nil.
func (p *Processor) take(g *groupWorker, n int) []Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(g.queue) == 0 {
		delete(p.groups, g.key)
		return nil
	}
	n = min(n, len(g.queue))
	batch := make([]Message, n)
	copy(batch, g.queue[:n])
	g.queue = g.queue[n:]
	if len(g.queue) == 0 {
		g.queue = nil
	}
	return batch
}

func (p *Processor) work(g *groupWorker) {
	defer p.workers.Done()
	for {
		if !p.awaitRecorder() {
			p.releaseRest(g)
			return
		}
		select {
		case p.sem <- struct{}{}:
		case <-p.stopping:
			p.releaseRest(g)
			return
		}
		select {
		case <-p.stopping:
			<-p.sem
			p.releaseRest(g)
			return
		default:
		}
		batch := p.take(g, p.cfg.PublishBatchSize)
		if batch == nil {
			<-p.sem
			return
		}
		blocked := p.publish(g, batch)
		<-p.sem
		if blocked {
			// An ordered group stops at a retry (or a dead letter that
			// blocks it): what it holds goes back to PENDING behind the
			// failed message (the store will not hand out the rest until
			// that one is done).
			p.releaseRest(g)
			return
		}
	}
}

// releaseRest releases everything still queued for g and unregisters it.
func (p *Processor) releaseRest(g *groupWorker) {
	p.mu.Lock()
	rest := g.queue
	g.queue = nil
	delete(p.groups, g.key)
	p.mu.Unlock()
	if len(rest) == 0 {
		return
	}
	fb := &finishBatch{}
	for i := range rest {
		fb.add(rest[i], Outcome{Kind: OutcomeReleased}, nil)
	}
	p.recordCh <- fb
}

// finished is one message's outcome on its way to MessageFinish, with what
// the observers are told once it is recorded.
type finished struct {
	msg Message
	out Outcome
	err error // the publisher's error, for AttemptEvent.Err
	// inherit is the earlier lease of msg whose outcome was being written
	// when msg was claimed again (see hold): when the store refused that
	// outcome, it is recorded under this lease instead of the release.
	inherit *lease
}

// finishBatch is the outcomes of one published batch (or of one release).
type finishBatch struct {
	items []finished
	// expired counts the messages not published because their lease had
	// expired: nothing is recorded for them.
	expired int
	// published counts the items of a publish call, added to
	// Processor.unrecorded until they are written.
	published int
}

// add queues the outcome o of m; it fills in the fields every outcome
// takes from the message.
func (b *finishBatch) add(m Message, o Outcome, err error) {
	o.Topic, o.ID, o.Attempt, o.ClaimToken = m.Topic, m.ID, m.Attempts, m.ClaimToken
	b.items = append(b.items, finished{msg: m, out: o, err: err})
}

// publish sends one batch of a group and queues its outcomes. It returns
// true when an ordered group must stop (a message will be retried later,
// or is a dead letter that holds its group).
func (p *Processor) publish(g *groupWorker, batch []Message) (blocked bool) {
	now := p.cfg.Clock.Now()
	fb := &finishBatch{}
	// A message whose lease already expired while it waited in the buffer
	// may have been recovered and claimed by another processor: do not
	// publish it (the lease fence would refuse its outcome anyway).
	live := batch[:0:0]
	for i := range batch {
		if !p.holds(batch[i], now) {
			fb.expired++
			p.forget(batch[i])
			continue
		}
		live = append(live, batch[i])
	}
	if len(live) > 0 {
		for i := range live {
			p.cfg.Observer.OnAttemptStarted(p.pubCtx, AttemptEvent{Message: live[i], Attempt: live[i].Attempts, StartedAt: now})
		}
		results := p.callPublisher(live)
		doneAt := p.cfg.Clock.Now()
		failed := false
		var deferred *DeferError
		for i := range live {
			m := live[i]
			r := results[i]
			switch {
			case r.Err == nil:
				// Also after an earlier failure in an ordered group: the
				// publisher sent it, so record the truth.
				fb.add(m, Outcome{Kind: OutcomeSent, ProviderMessageID: r.ProviderMessageID, ProviderResponse: r.ProviderResponse, StartedAt: now}, nil)
			case errors.As(r.Err, &deferred) && deferred.Delay > 0:
				fb.add(m, Outcome{Kind: OutcomeReleased, NextAttemptAt: doneAt.Add(deferred.Delay), Error: ErrorInfoOf(r.Err), StartedAt: now}, r.Err)
				if g.ordered {
					failed = true
				}
			case errors.Is(r.Err, ErrNotAttempted):
				fb.add(m, Outcome{Kind: OutcomeReleased, StartedAt: now}, r.Err)
				if g.ordered {
					failed = true
				}
			default:
				maxA := m.MaxAttempts
				if maxA == 0 {
					maxA = p.cfg.MaxAttempts
				}
				next, retry := p.cfg.Backoff.Next(doneAt, m.Attempts, maxA, !IsRetryable(r.Err), RetryDelayOf(r.Err))
				o := Outcome{Kind: OutcomeDead, ProviderResponse: r.ProviderResponse, Error: ErrorInfoOf(r.Err), StartedAt: now}
				switch {
				case retry:
					o.Kind, o.NextAttemptAt = OutcomeRetry, next
					if g.ordered {
						failed = true
					}
				case g.ordered && p.cfg.DeadLetter.Blocks(m.Topic, m.Group):
					// The dead letter holds its group: what the worker
					// still queues goes back behind it.
					o.BlockGroup = true
					failed = true
				}
				fb.add(m, o, r.Err)
			}
		}
		blocked = failed
	}
	fb.published = len(fb.items)
	p.addUnrecorded(fb.published)
	p.recordCh <- fb
	return blocked
}

// callPublisher calls the publisher, turning a panic or a wrong number of
// results into retryable errors.
func (p *Processor) callPublisher(batch []Message) (results []Result) {
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("publisher panicked", "panic", fmt.Sprint(r), "messages", len(batch), "stack", string(debug.Stack()))
			results = make([]Result, len(batch))
			for i := range results {
				results[i] = Result{Err: Retryable("publisher_panic", "the publisher panicked")}
			}
		}
	}()
	results = p.pub.Publish(p.pubCtx, batch)
	if len(results) != len(batch) {
		p.log.Error("publisher returned a wrong number of results", "messages", len(batch), "results", len(results))
		fixed := make([]Result, len(batch))
		for i := range fixed {
			if i < len(results) {
				fixed[i] = results[i]
			} else {
				fixed[i] = Result{Err: Retryable("missing_result", "the publisher returned no result for this message")}
			}
		}
		results = fixed
	}
	return results
}

// recordLoop writes outcomes, merging whatever batches are waiting into one
// MessageFinish call.
func (p *Processor) recordLoop() {
	defer p.recorders.Done()
	const maxMerge = 2000
	for fb := range p.recordCh {
		batches := []*finishBatch{fb}
		n := len(fb.items) + fb.expired
	merge:
		for n < maxMerge {
			select {
			case more, ok := <-p.recordCh:
				if !ok {
					break merge
				}
				batches = append(batches, more)
				n += len(more.items) + more.expired
			default:
				break merge
			}
		}
		p.record(batches)
	}
}

func (p *Processor) record(batches []*finishBatch) {
	params := MessageFinishParams{Owner: p.cfg.ID, Now: p.cfg.Clock.Now()}
	count := 0
	// The leases the outcomes are written under, taken before the write:
	// once it commits, a message may be claimed again (see forgetLeases).
	// An outcome of a lease that a later claim of the same message replaced
	// is left out (see hold); the others' leases are marked as being
	// written, in the same critical section.
	var held []*lease
	superseded := make([][]bool, len(batches))
	nSuperseded := 0
	p.leaseMu.Lock()
	for bi, b := range batches {
		superseded[bi] = make([]bool, len(b.items))
		for i := range b.items {
			f := &b.items[i]
			if old := f.inherit; old != nil && old.refused && old.out != nil {
				// The earlier lease's outcome, which the store refused:
				// the message was published under it (or its attempt
				// failed), so that is recorded under this lease.
				o := *old.out
				o.Attempt, o.ClaimToken = f.msg.Attempts, f.msg.ClaimToken
				f.out, f.err = o, old.outErr
			}
			l := p.leases[leaseKey(&f.msg)]
			switch {
			case l == nil:
			case l.of(&f.msg):
				l.writing = true
				l.out, l.outErr = &f.out, f.err
				held = append(held, l)
			default:
				superseded[bi][i] = true
				nSuperseded++
			}
		}
	}
	p.leaseMu.Unlock()
	if nSuperseded > 0 {
		p.log.Warn("outcomes left out: their messages were claimed again after the lease expired", "messages", nSuperseded)
	}
	for bi, b := range batches {
		count += b.expired
		for i, f := range b.items {
			if superseded[bi][i] {
				count++
				continue
			}
			switch f.out.Kind {
			case OutcomeSent:
				p.counters.sent.Add(1)
			case OutcomeRetry:
				p.counters.retried.Add(1)
			case OutcomeDead:
				p.counters.dead.Add(1)
			case OutcomeReleased:
				p.counters.released.Add(1)
			}
			params.Outcomes = append(params.Outcomes, f.out)
			count++
		}
	}
	var lost map[string]bool
	if len(params.Outcomes) > 0 {
		res, err := p.finishWithRetry(params)
		if err != nil {
			p.setHealth(err)
			p.log.Error("recording outcomes failed; the messages will be recovered when their lease expires", "err", err, "messages", count)
		}
		if len(res.LeaseLost) > 0 {
			p.log.Warn("outcomes refused: lease lost", "messages", len(res.LeaseLost))
			lost = make(map[string]bool, len(res.LeaseLost))
			for _, id := range res.LeaseLost {
				lost[id] = true
			}
		}
	}
	published := 0
	for _, b := range batches {
		published += b.published
	}
	if len(lost) > 0 {
		p.leaseMu.Lock()
		for _, l := range held {
			l.refused = lost[l.id]
		}
		p.leaseMu.Unlock()
	}
	p.forgetLeases(held)
	p.addUnrecorded(-published)
	ctx := context.WithoutCancel(p.pubCtx)
	for bi, b := range batches {
		for i, f := range b.items {
			o := f.out
			if lost[o.ID] || superseded[bi][i] {
				continue
			}
			p.noteDue(o)
			if o.Kind == OutcomeReleased {
				continue
			}
			ev := AttemptEvent{Message: f.msg, Attempt: o.Attempt, Err: f.err, StartedAt: o.StartedAt, Duration: params.Now.Sub(o.StartedAt)}
			switch o.Kind {
			case OutcomeSent:
				ev.Outcome = AttemptSucceeded
				ev.Message.Status = StatusSent
				ev.Message.ProviderMessageID = o.ProviderMessageID
			case OutcomeRetry:
				ev.Outcome = AttemptRetry
				ev.NextAttemptAt = o.NextAttemptAt
				ev.Message.Status = StatusPending
				ev.Message.NextAttemptAt = o.NextAttemptAt
				ev.Message.LastError = o.Error
			case OutcomeDead:
				ev.Outcome = AttemptFailed
				ev.Message.Status = StatusFailed
				ev.Message.LastError = o.Error
				ev.Message.BlocksGroup = o.BlockGroup
			}
			p.cfg.Observer.OnAttemptFinished(ctx, ev)
			switch o.Kind {
			case OutcomeSent:
				p.cfg.Observer.OnSent(ctx, ev)
			case OutcomeDead:
				p.cfg.Observer.OnFailed(ctx, ev)
			}
		}
	}
	if p.inflight.Add(-int64(count)) == 0 {
		p.stateMu.Lock()
		p.broadcastLocked()
		p.stateMu.Unlock()
	}
	if p.waitingForSpace.CompareAndSwap(true, false) {
		p.Wake()
	}
}

// finishWithRetry records outcomes, retrying transient store errors for up
// to a minute so that a database restart does not turn sent messages into
// duplicates.
func (p *Processor) finishWithRetry(params MessageFinishParams) (FinishResult, error) {
	deadline := time.Now().Add(time.Minute)
	delay := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := p.store.MessageFinish(ctx, params)
		cancel()
		if err == nil || errors.Is(err, ErrInvalidInput) || time.Now().Add(delay).After(deadline) {
			return res, err
		}
		p.log.Warn("recording outcomes failed, retrying", "err", err, "retry_in", delay)
		time.Sleep(delay)
		delay = min(delay*2, 5*time.Second)
	}
}
