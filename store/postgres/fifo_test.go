package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestClaimFIFOConcurrentClaimers drives the store directly with several
// claimers that claim concurrently and finish with random outcomes (sent,
// retry due at once, release), and checks at every claim that each claimed
// message's predecessors in its group are all SENT or claimed before it in
// the same call. Outcomes are recorded under a write lock shared with the
// checker, so the model is exact; claims themselves run concurrently, which
// is where SKIP LOCKED alone would let claimer B take message n+1 while
// claimer A holds message n.
func TestClaimFIFOConcurrentClaimers(t *testing.T) {
	t.Parallel()
	t.Run("Serialised", func(t *testing.T) { testClaimFIFO(t, false, false) })
	t.Run("Concurrent", func(t *testing.T) { testClaimFIFO(t, true, false) })
	t.Run("ConcurrentAsyncCommit", func(t *testing.T) { testClaimFIFO(t, true, true) })
}

// testClaimFIFO: with concurrent, outcomes and claims overlap too; a
// message counts as sent from just before its outcome is written, so the
// check is weaker but sees the claim/outcome races.
func testClaimFIFO(t *testing.T, concurrent, async bool) {
	t.Parallel()
	b := setup(t, func(o *postgres.Options) { o.ClaimPerGroup = 7; o.AsyncCommit = async })
	const groups, perGroup, claimers = 40, 50, 6
	// order[g] = IDs of group g in enqueue order; index of each ID.
	order := make([][]string, groups)
	index := map[string][2]int{}
	var msgs []outbox.Message
	for i := range groups * perGroup {
		msgs = append(msgs, msg("t", fmt.Sprintf("g%02d", i%groups), i))
	}
	for j := 0; j < len(msgs); j += 500 {
		for k, r := range b.enqueue(msgs[j:min(j+500, len(msgs))]...) {
			g := (j + k) % groups
			index[r.Message.ID] = [2]int{g, len(order[g])}
			order[g] = append(order[g], r.Message.ID)
		}
	}
	unordered := b.enqueue(msg("t", "", -1), msg("t", "", -2))

	var (
		model    sync.RWMutex // guards sent
		model2   sync.Mutex   // guards nSent, failures
		sent     = map[string]bool{}
		nSent    int
		failures []string
	)
	total := groups*perGroup + len(unordered)
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for c := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("c%d", c)
			rng := rand.New(rand.NewPCG(uint64(c), 9))
			for ctx.Err() == nil {
				// seen: what counts as sent for this claim. Serialised, the
				// model itself under a read lock (no outcome runs during the
				// claim); concurrent, a copy taken after the claim returned
				// (outcomes are marked before they are written, so everything
				// written before the claim's snapshot is in it).
				var seen map[string]bool
				if !concurrent {
					model.RLock()
					seen = sent
				}
				model2.Lock()
				done := nSent == total
				model2.Unlock()
				ms, err := b.store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1 + rng.IntN(60), Owner: owner, Now: time.Now()})
				if err == nil && concurrent {
					model.Lock()
					seen = make(map[string]bool, len(sent))
					for k := range sent {
						seen[k] = true
					}
					model.Unlock()
				}
				if err == nil {
					inBatch := map[string]bool{}
					for _, m := range ms {
						if gi, ok := index[m.ID]; ok {
							for j := 0; j < gi[1]; j++ {
								prev := order[gi[0]][j]
								if !seen[prev] && !inBatch[prev] {
									model2.Lock()
									failures = append(failures, fmt.Sprintf("%s claimed message %d of group %d while message %d was not sent", owner, gi[1], gi[0], j))
									model2.Unlock()
								}
							}
						}
						inBatch[m.ID] = true
					}
				}
				if !concurrent {
					model.RUnlock()
				}
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("claim: %v", err)
					}
					return
				}
				if done {
					return
				}
				if len(ms) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				// Outcomes: per group in order; a retry or release blocks
				// the rest of the group in this batch (released).
				p := outbox.MessageFinishParams{Owner: owner, Now: time.Now()}
				blocked := map[string]bool{}
				for _, m := range ms {
					key := m.GroupKey()
					switch r := rng.IntN(10); {
					case m.Group != "" && blocked[key]:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
					case r < 6:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
					case r < 8:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeRetry, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, NextAttemptAt: time.Now(), Error: &outbox.ErrorInfo{Code: "x"}})
						blocked[key] = true
					default:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
						blocked[key] = true
					}
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				mark := func() {
					model2.Lock()
					defer model2.Unlock()
					for _, o := range p.Outcomes {
						if o.Kind != outbox.OutcomeSent {
							continue
						}
						if sent[o.ID] {
							failures = append(failures, "sent twice: "+o.ID)
						}
						sent[o.ID] = true
						nSent++
					}
				}
				var res outbox.FinishResult
				if concurrent {
					model.Lock()
					mark()
					model.Unlock()
					// As the processor does: the retry first, the
					// releases of the rest of the group in a second call.
					var first, rel []outbox.Outcome
					for _, o := range p.Outcomes {
						if o.Kind == outbox.OutcomeReleased {
							rel = append(rel, o)
						} else {
							first = append(first, o)
						}
					}
					p.Outcomes = first
					res, err = b.store.MessageFinish(ctx, p)
					if err == nil && len(rel) > 0 {
						var r2 outbox.FinishResult
						r2, err = b.store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: owner, Now: time.Now(), Outcomes: rel})
						res.LeaseLost = append(res.LeaseLost, r2.LeaseLost...)
					}
					model.Lock()
				} else {
					model.Lock()
					res, err = b.store.MessageFinish(ctx, p)
					if err == nil {
						mark()
					}
				}
				if err == nil && len(res.LeaseLost) > 0 {
					model2.Lock()
					failures = append(failures, fmt.Sprintf("lease lost: %v", res.LeaseLost))
					model2.Unlock()
				}
				model.Unlock()
				if err != nil {
					t.Errorf("finish: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, f := range failures {
		if i > 10 {
			break
		}
		t.Error(f)
	}
	if nSent != total {
		t.Fatalf("sent %d of %d", nSent, total)
	}
}

// TestCommitOrderFollowsSequence: a second transaction enqueueing into the
// same group waits for the first; the claim never sees the later message
// before the earlier one, whatever order the transactions try to commit in.
func TestCommitOrderFollowsSequence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	tx1, err := b.pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := b.ob.EnqueueTx(ctx, tx1, msg("t", "order-1", 1))
	if err != nil {
		t.Fatal(err)
	}
	// tx2 enqueues the group's next message and tries to commit first.
	type res struct {
		e   []outbox.Enqueued
		err error
		at  time.Time
	}
	done := make(chan res, 1)
	go func() {
		tx2, err := b.pg.Pool.Begin(ctx)
		if err != nil {
			done <- res{err: err}
			return
		}
		e, err := b.ob.EnqueueTx(ctx, tx2, msg("t", "order-1", 2), msg("t", "", 99))
		if err == nil {
			err = tx2.Commit(ctx)
		}
		done <- res{e, err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("the second transaction committed (%v) while the first, earlier in the group, was open", r.err)
	default:
	}
	if ms := b.claim("p", 10); len(ms) != 0 {
		t.Fatalf("claimed %d messages of uncommitted transactions", len(ms))
	}
	committed := time.Now()
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.at.Before(committed) {
		t.Fatal("the second transaction finished before the first committed")
	}
	if r.e[0].Message.Seq <= r1[0].Message.Seq {
		t.Fatalf("seq %d after %d", r.e[0].Message.Seq, r1[0].Message.Seq)
	}
	// Publication order follows the group's sequence: one at a time.
	ms := b.claim("p", 1)
	if len(ms) != 1 || ms[0].ID != r1[0].Message.ID {
		t.Fatalf("first claim %v, want %s", ids(ms), r1[0].Message.ID)
	}
	if more := b.claim("q", 10); len(more) != 1 || more[0].Group != "" {
		t.Fatalf("a second claimer got %v while message 1 is in flight; want only the unordered one", ids(more))
	}
	b.sent("p", ms...)
	if ms := b.claim("q", 10); len(ms) != 1 || ms[0].ID != r.e[0].Message.ID {
		t.Fatalf("after message 1 was sent: claimed %v", ids(ms))
	}

	// A rolled-back first transaction releases the group at once.
	tx3, _ := b.pg.Pool.Begin(ctx)
	if _, err := b.ob.EnqueueTx(ctx, tx3, msg("t", "order-2", 1)); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = tx3.Rollback(ctx)
	}()
	r4 := b.enqueue(msg("t", "order-2", 2)) // waits for tx3
	if ms := b.claim("p", 10); len(ms) != 1 || ms[0].ID != r4[0].Message.ID {
		t.Fatalf("after rollback: claimed %v", ids(ms))
	}
}

var _ = pgx.ErrNoRows

// TestClaimLooksPastBlockedBacklog: when the oldest pending messages all
// belong to a group that is blocked (its head is in flight), the claim
// still finds the groups behind them, however long the blocked backlog.
func TestClaimLooksPastBlockedBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var big []outbox.Message
	for i := range 2500 {
		big = append(big, msg("t", "big", i))
	}
	b.enqueue(big...)
	others := b.enqueue(msg("t", "a", 0), msg("t", "b", 0), msg("u", "c", 0), msg("t", "", 0))
	head := b.claim("p", 1)
	if len(head) != 1 || head[0].Group != "big" {
		t.Fatalf("first claim: %v", ids(head))
	}
	got := b.claim("q", 50)
	want := map[string]bool{}
	for _, o := range others {
		want[o.Message.ID] = true
	}
	if len(got) != len(want) {
		t.Fatalf("claimed %d messages, want the %d behind the blocked backlog", len(got), len(want))
	}
	for _, m := range got {
		if !want[m.ID] {
			t.Fatalf("claimed %s of group %q", m.ID, m.Group)
		}
	}
	// With a topic filter too.
	if more := b.claim("r", 50); len(more) != 0 {
		t.Fatalf("claimed %d more", len(more))
	}
	b.sent("q", got...)
	b.enqueue(msg("u", "d", 0))
	ms, err := b.store.MessageClaim(b.ctx, outbox.MessageClaimParams{Limit: 5, Owner: "r", Topics: []string{"u"}, Now: time.Now()})
	if err != nil || len(ms) != 1 || ms[0].Group != "d" {
		t.Fatalf("topic claim past the backlog: %v %v", ids(ms), err)
	}
}

// TestClaimStopsAtLeasedMessages: a group's leased (PROCESSING) messages,
// which the lease index holds apart from the waiting ones, still hold the
// group: a waiting message behind a leased one is not a head, and a run
// ends before the group's first leased message.
func TestClaimStopsAtLeasedMessages(t *testing.T) {
	b := setup(t)
	var ms []outbox.Message
	for i := range 5 {
		ms = append(ms, b.enqueue(msg("t", "g", i))[0].Message)
	}
	claimed := map[string]string{} // the claim token of each message, by ID
	release := func(rel ...outbox.Message) {
		t.Helper()
		p := outbox.MessageFinishParams{Owner: "p1", Now: time.Now()}
		for _, m := range rel {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: 1, ClaimToken: claimed[m.ID]})
		}
		if res, err := b.store.MessageFinish(b.ctx, p); err != nil || len(res.LeaseLost) > 0 {
			t.Fatalf("release: %+v, %v", res, err)
		}
	}
	got := b.claim("p1", 5)
	if len(got) != 5 {
		t.Fatalf("first claim: %v, want the 5 messages", ids(got))
	}
	for _, m := range got {
		claimed[m.ID] = m.ClaimToken
	}
	// ms[1] and ms[3] go back to PENDING; ms[0], ms[2] and ms[4] stay leased.
	release(ms[1], ms[3])
	if got := b.claim("p2", 100); len(got) != 0 {
		t.Fatalf("claimed %v while the group's first message is leased", ids(got))
	}
	// ms[0] released too: the group's first unfinished message is ms[0],
	// and its run ends before ms[2], still leased.
	release(ms[0])
	if got, want := ids(b.claim("p2", 100)), ids(ms[:2]); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("claimed %v, want %v (the run ends before the leased ms[2])", got, want)
	}
}
