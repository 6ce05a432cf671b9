package storetest

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Elector is a store's leader election as the suite drives it (each
// store of this module returns one from Store.Elector): IsLeader, so it
// can be an outbox.Config.Leader, and Run, which campaigns until its
// context ends and calls lead with a context that ends with each term this
// replica leads.
type Elector interface {
	outbox.Leader
	Run(ctx context.Context, lead func(ctx context.Context)) error
}

// ElectorHarness is what an adapter passes to RunElector.
type ElectorHarness struct {
	// NewElection returns a fresh election for t, isolated from every
	// other (its own database, schema, file or election name); it
	// registers its own cleanup with t.Cleanup. It is called once per
	// subtest, from parallel subtests.
	NewElection func(t *testing.T) Election
}

// Election is one leadership, contested by the electors New returns.
type Election struct {
	// New returns another elector of this election, with its own
	// connection or session where the store's electors have one (so that
	// Sever can end it alone). The suite starts its Run.
	New func(t *testing.T) Elector
	// Held reports whether the leadership is taken in the database now
	// (the lock held by some session, the lease unexpired). The suite asks
	// it after a leader's Run returned, to tell a released leadership from
	// one left to expire: a lease must outlive the suite's one-second wait
	// for sessions closed by a cancelled Run to end.
	Held func(ctx context.Context) (bool, error)
	// Sever ends, from outside, what the leadership of leader (the current
	// leader, an elector New returned) rests on, as a crash or a network
	// loss would: it kills its connection, disconnects its client, or
	// closes its database. The elector is not told; it must notice, step
	// down, and leave the leadership to another. Nil when the store's
	// leadership rests on nothing that can be severed: the case "Sever" is
	// then skipped.
	Sever func(ctx context.Context, leader Elector) error
	// Bound is how long the election may stay without a leader after its
	// leader lost its session: the store's RetryInterval plus
	// CheckInterval for a lock held by a session, its lease's TTL plus
	// RetryInterval for a lease. The suite waits up to Bound plus a margin
	// for a loaded machine (electionMargin) and logs how long it took.
	Bound time.Duration
}

// electionMargin is what the suite adds to Election.Bound before it gives
// up waiting: room for a loaded CI machine, not a promise of the store.
const electionMargin = 30 * time.Second

// RunElector runs the conformance cases of a store's leader election, each
// a parallel subtest on a fresh election:
//
//   - OneLeader: of three electors exactly one leads, and never two at
//     once; lead is called only while IsLeader reports true.
//   - LeadReturns: when lead returns on its own, Run releases the
//     leadership and campaigns again (it does not return).
//   - Release: cancelling a leader's context ends its term, Run returns
//     nil, and the leadership is released in the database at once (not
//     left to expire); another elector then leads.
//   - Sever: a leader whose session is ended from outside steps down, and
//     a new term begins within the election's Bound (another elector's, or
//     the severed one's on a new session); no two electors lead at once,
//     except the severed one until it has noticed.
//
// Every case ends by cancelling every Run: each returns nil, no elector
// reports leading, the leadership is free (Held), and no goroutine that
// Run started, directly or through others, is left running (each Run runs
// under a runtime/pprof label, which the goroutines it starts inherit).
//
// A store runs it next to Run:
//
//	func TestElectorConformance(t *testing.T) {
//		storetest.RunElector(t, storetest.ElectorHarness{NewElection: newElection})
//	}
func RunElector(t *testing.T, h ElectorHarness) {
	t.Helper()
	if h.NewElection == nil {
		t.Fatal("storetest: ElectorHarness.NewElection is nil")
	}
	t.Run("OneLeader", func(t *testing.T) { testOneLeader(t, h) })
	t.Run("LeadReturns", func(t *testing.T) { testLeadReturns(t, h) })
	t.Run("Release", func(t *testing.T) { testRelease(t, h) })
	t.Run("Sever", func(t *testing.T) { testSever(t, h) })
}

func testOneLeader(t *testing.T, h ElectorHarness) {
	c := newContest(t, h)
	for range 3 {
		c.start(false)
	}
	c.waitFor("a leader", c.margin(), func() bool { return c.leaders() == 1 })
	// Watch the election for a while: one leader all along.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		if n := c.leaders(); n != 1 {
			t.Fatalf("%d electors report leading", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.wantHeld(true)
	c.stopAll()
}

func testLeadReturns(t *testing.T, h ElectorHarness) {
	c := newContest(t, h)
	a, b := c.start(true), c.start(true)
	c.waitFor("a second term after lead returned", c.margin(), func() bool { return c.totalTerms() >= 2 })
	for _, k := range []*contender{a, b} {
		select {
		case err := <-k.done:
			t.Fatalf("Run of elector %d returned (%v) after its lead returned, want it to campaign on", k.n, err)
		default:
		}
	}
	c.waitFor("a leader", c.margin(), func() bool { return c.leaders() == 1 })
	c.stopAll()
}

func testRelease(t *testing.T, h ElectorHarness) {
	c := newContest(t, h)
	first := c.start(false)
	c.waitFor("the only elector to lead", c.margin(), func() bool { return first.leading() && first.e.IsLeader() })
	c.wantHeld(true)
	c.stop(first)
	// Released, not left to expire: the election is free the moment Run
	// returned.
	c.wantHeld(false)
	second := c.start(false)
	began := time.Now()
	c.waitFor("a new elector to lead after the leader stopped", c.margin(), func() bool { return second.leading() })
	c.t.Logf("a new elector led %s after the leader's Run returned", time.Since(began).Round(time.Millisecond))
	c.stopAll()
}

func testSever(t *testing.T, h ElectorHarness) {
	c := newContest(t, h)
	if c.el.Sever == nil {
		t.Skip("storetest: the election has no Sever: the store's leadership rests on no session")
	}
	for range 3 {
		c.start(false)
	}
	// The leader is read in the same check as the count: a term may end
	// between two reads.
	var old *contender
	c.waitFor("a leader", c.margin(), func() bool {
		old = c.leader()
		return c.leaders() == 1 && old != nil
	})
	before := c.totalTerms()
	c.mu.Lock()
	c.severed[old] = true
	c.mu.Unlock()
	began := time.Now()
	if err := c.el.Sever(c.ctx, old.e); err != nil {
		t.Fatalf("Sever: %v", err)
	}
	c.waitFor("the severed leader to step down", c.margin(), func() bool { return !old.leading() && !old.e.IsLeader() })
	stepped := time.Since(began)
	c.mu.Lock()
	delete(c.severed, old)
	c.mu.Unlock()
	// A new term, on a session that works: another elector's, or the
	// severed one's on a new session.
	c.waitFor("a new term after the leader's session was severed", c.margin(), func() bool {
		return c.totalTerms() > before && c.leader() != nil
	})
	next := "another elector"
	if c.leader() == old {
		next = "the severed elector, on a new session,"
	}
	t.Logf("the severed leader stepped down after %s; %s led after %s (Bound %s)",
		stepped.Round(time.Millisecond), next, time.Since(began).Round(time.Millisecond), c.el.Bound)
	c.waitFor("one leader", c.margin(), func() bool { return c.leaders() == 1 })
	c.stopAll()
}

// contest is one case's election and the electors running in it.
type contest struct {
	t   *testing.T
	el  Election
	ctx context.Context
	g   *goroutines

	mu      sync.Mutex
	all     []*contender
	active  map[*contender]bool
	severed map[*contender]bool
}

// contender is one elector of a contest and its Run.
type contender struct {
	n      int
	e      Elector
	cancel context.CancelFunc
	done   chan error // Run's result
	// quitFirst makes lead return at once in the first term.
	quitFirst bool

	mu     sync.Mutex
	terms  int
	inLead bool
}

func (k *contender) leading() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.inLead
}

func newContest(t *testing.T, h ElectorHarness) *contest {
	t.Helper()
	t.Parallel()
	el := h.NewElection(t)
	if el.New == nil || el.Held == nil {
		t.Fatal("storetest: the Election lacks New or Held")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	c := &contest{t: t, el: el, ctx: ctx, g: newGoroutines(t), active: map[*contender]bool{}, severed: map[*contender]bool{}}
	t.Cleanup(func() {
		// Whatever happened, end every Run before the backend goes.
		for _, k := range c.all {
			k.cancel()
		}
		for _, k := range c.all {
			select {
			case <-k.done:
			case <-time.After(electionMargin):
			}
		}
	})
	return c
}

// margin is how long the contest waits for a leader.
func (c *contest) margin() time.Duration { return c.el.Bound + electionMargin }

// start starts another elector's Run.
func (c *contest) start(quitFirst bool) *contender {
	c.t.Helper()
	e := c.el.New(c.t)
	if e == nil {
		c.t.Fatal("storetest: Election.New returned nil")
	}
	ctx, cancel := context.WithCancel(c.ctx)
	k := &contender{e: e, cancel: cancel, done: make(chan error, 1), quitFirst: quitFirst}
	c.mu.Lock()
	k.n = len(c.all) + 1
	c.all = append(c.all, k)
	c.mu.Unlock()
	c.g.Go(func() { k.done <- e.Run(ctx, func(ctx context.Context) { c.lead(ctx, k) }) })
	return k
}

// lead is every contender's lead: it checks that no other (unsevered)
// contender leads at once and that IsLeader agrees, then holds the term
// until its context ends (or returns at once, for a quitFirst's first
// term).
func (c *contest) lead(ctx context.Context, k *contender) {
	// A term may end before its lead starts (Run's context ended as the
	// term began): IsLeader is then already false, and lead's context
	// ends with it.
	if !k.e.IsLeader() {
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			c.t.Errorf("elector %d: lead was called while IsLeader reports false, and its context did not end", k.n)
		}
	}
	c.mu.Lock()
	for o := range c.active {
		if !c.severed[o] && !c.severed[k] {
			c.t.Errorf("electors %d and %d lead at once", o.n, k.n)
		}
	}
	c.active[k] = true
	c.mu.Unlock()
	k.mu.Lock()
	k.terms++
	first := k.terms == 1
	k.inLead = true
	k.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.active, k)
		c.mu.Unlock()
		k.mu.Lock()
		k.inLead = false
		k.mu.Unlock()
	}()
	if k.quitFirst && first {
		return
	}
	<-ctx.Done()
}

// leaders counts the contenders whose IsLeader reports true.
func (c *contest) leaders() int {
	c.mu.Lock()
	all := append([]*contender(nil), c.all...)
	c.mu.Unlock()
	n := 0
	for _, k := range all {
		if k.e.IsLeader() {
			n++
		}
	}
	return n
}

// leader returns the contender in its lead, or nil.
func (c *contest) leader() *contender {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.active {
		return k
	}
	return nil
}

func (c *contest) totalTerms() int {
	c.mu.Lock()
	all := append([]*contender(nil), c.all...)
	c.mu.Unlock()
	n := 0
	for _, k := range all {
		k.mu.Lock()
		n += k.terms
		k.mu.Unlock()
	}
	return n
}

// waitFor polls cond until it holds, failing the test after within.
func (c *contest) waitFor(what string, within time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("storetest: waited %s for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *contest) wantHeld(want bool) {
	c.t.Helper()
	got, err := c.el.Held(c.ctx)
	if err != nil {
		c.t.Fatalf("Held: %v", err)
	}
	if got != want {
		c.t.Fatalf("Held reports %v, want %v", got, want)
	}
}

// releaseSettle is how long after the last Run returned the leadership
// may stay taken (see stopAll). A store whose lease outlives its holder
// uses a lease longer than this in its Election.
const releaseSettle = time.Second

// stop cancels k's Run and waits for it: Run returns nil and k no longer
// leads.
func (c *contest) stop(k *contender) {
	c.t.Helper()
	k.cancel()
	select {
	case err := <-k.done:
		if err != nil {
			c.t.Fatalf("Run of elector %d returned %v after its context ended, want nil", k.n, err)
		}
		k.done <- nil // for the cleanup
	case <-time.After(electionMargin):
		c.t.Fatalf("Run of elector %d did not return within %s of its context ending", k.n, electionMargin)
	}
	if k.leading() || k.e.IsLeader() {
		c.t.Fatalf("elector %d still leads after its Run returned", k.n)
	}
}

// stopAll stops every contender, then checks that nothing leads, the
// leadership is free, and no goroutine the Runs started is left.
func (c *contest) stopAll() {
	c.t.Helper()
	c.mu.Lock()
	all := append([]*contender(nil), c.all...)
	c.mu.Unlock()
	for _, k := range all {
		k.cancel()
	}
	for _, k := range all {
		c.stop(k)
	}
	if n := c.leaders(); n != 0 {
		c.t.Fatalf("%d electors report leading after every Run returned", n)
	}
	// A follower whose Run was cancelled in the middle of taking the
	// leadership may leave it to its closed session, which the server
	// ends a moment later: the leadership must be free within
	// releaseSettle, well before a lease or lock left behind would lapse.
	for deadline := time.Now().Add(releaseSettle); ; time.Sleep(10 * time.Millisecond) {
		held, err := c.el.Held(c.ctx)
		if err != nil {
			c.t.Fatalf("Held: %v", err)
		}
		if !held {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the leadership is still held %s after every Run returned", releaseSettle)
		}
	}
	c.g.wantNone()
}

// goroutines tracks the goroutines a case starts and every goroutine they
// start, directly or not: each runs under a pprof label of its own
// (runtime/pprof.Do), which every goroutine inherits from the one that
// created it, so the goroutine profile shows them whether or not the
// goroutines between them are still running.
type goroutines struct {
	t     *testing.T
	label string
}

// goroutineCases numbers the goroutines trackers, so each has its own label.
var goroutineCases atomic.Int64

// goroutineLabel is the pprof label key of the goroutines a case starts.
const goroutineLabel = "outboxkit-storetest-elector"

func newGoroutines(t *testing.T) *goroutines {
	return &goroutines{t: t, label: strconv.FormatInt(goroutineCases.Add(1), 10)}
}

// Go runs f in a new goroutine, under the tracker's label.
func (g *goroutines) Go(f func()) {
	go pprof.Do(context.Background(), pprof.Labels(goroutineLabel, g.label), func(context.Context) { f() })
}

// wantNone fails the test when goroutines started through Go are still
// running electionMargin after it is called (a closed connection's
// reader may take a moment to go).
func (g *goroutines) wantNone() {
	g.t.Helper()
	deadline := time.Now().Add(electionMargin)
	for {
		n, stacks := g.running()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("storetest: %d goroutines started by Run still run after every Run returned:\n\n%s",
				n, strings.Join(stacks, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running counts the goroutines carrying the tracker's label and returns
// their stacks, from the goroutine profile (debug=1: one record per
// distinct stack and label set, headed by how many goroutines share it).
func (g *goroutines) running() (int, []string) {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		g.t.Fatalf("storetest: goroutine profile: %v", err)
	}
	want := fmt.Sprintf("%q:%q", goroutineLabel, g.label)
	n := 0
	var stacks []string
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		labels, c := "", 1
		for _, line := range strings.Split(rec, "\n") {
			if l, ok := strings.CutPrefix(line, "# labels: "); ok {
				labels = l
			}
			if count, _, ok := strings.Cut(line, " @ "); ok {
				if v, err := strconv.Atoi(count); err == nil {
					c = v
				}
			}
		}
		if !strings.Contains(labels, want) {
			continue
		}
		n += c
		stacks = append(stacks, rec)
	}
	return n, stacks
}
