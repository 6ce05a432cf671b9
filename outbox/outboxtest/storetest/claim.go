package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

func testClaim[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("LeasesDueMessages", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		due := e.enqueue(msg("t", "", 1))[0]
		later := msg("t", "", 2)
		later.NextAttemptAt = e.at(time.Hour)
		later = e.enqueue(later)[0]

		now := e.at(time.Second)
		got := e.claim("owner-1", 10, now)
		wantIDs(t, "claim at t0+1s", got, due)
		c := got[0]
		if c.Status != outbox.StatusProcessing || c.Attempts != 1 || c.ClaimedBy != "owner-1" {
			t.Fatalf("claimed message: status %s attempts %d owner %q; want PROCESSING 1 owner-1", c.Status, c.Attempts, c.ClaimedBy)
		}
		wantTime(t, "ClaimedAt", c.ClaimedAt, now)
		stored := e.wantStatus("", due.ID, outbox.StatusProcessing)
		if stored.Attempts != 1 || stored.ClaimedBy != "owner-1" || !sameTime(stored.ClaimedAt, now) {
			t.Fatalf("stored lease: %+v", stored)
		}
		// Leased: nobody else gets it; the later one is not due yet.
		if got := e.claim("owner-2", 10, e.at(30*time.Minute)); len(got) != 0 {
			t.Fatalf("second claim got %v, want nothing", ids(got))
		}
		wantIDs(t, "claim at t0+1h", e.claim("owner-2", 10, e.at(time.Hour)), later)
	})

	t.Run("LimitInSeqOrder", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "", 5)
		wantIDs(t, "first claim", e.claim("p", 2, e.t0), ms[0], ms[1])
		wantIDs(t, "second claim", e.claim("p", 2, e.t0), ms[2], ms[3])
		wantIDs(t, "third claim", e.claim("p", 2, e.t0), ms[4])
		wantIDs(t, "fourth claim", e.claim("p", 2, e.t0))
	})

	t.Run("Topics", func(t *testing.T) {
		e := setup(t, h)
		a := e.enqueue(msg("a", "", 1), msg("b", "", 2), msg("c", "", 3), msg("a", "", 4))
		wantIDs(t, "claim topic a", e.claimP(outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: e.t0, Topics: []string{"a"}}), a[0], a[3])
		wantIDs(t, "claim topics b, c", e.claimP(outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: e.t0, Topics: []string{"c", "b"}}), a[1], a[2])
	})

	t.Run("InvalidParams", func(t *testing.T) {
		e := setup(t, h)
		e.enqueue(msg("t", "", 1))
		for _, p := range []outbox.MessageClaimParams{
			{Limit: 0, Owner: "p", Now: e.t0},
			{Limit: -1, Owner: "p", Now: e.t0},
			{Limit: 1, Owner: "", Now: e.t0},
		} {
			_, err := e.s.MessageClaim(e.ctx, p)
			wantErrIs(t, fmt.Sprintf("MessageClaim(%+v)", p), err, outbox.ErrInvalidInput)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusPending: 1})
	})

	t.Run("ConcurrentClaimersNeverShare", func(t *testing.T) {
		need(t, h, CapConcurrentClaim)
		e := setup(t, h)
		const n = 300
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			g := ""
			if i%3 == 0 {
				g = fmt.Sprintf("g%d", i%7)
			}
			msgs[i] = msg("t", g, i)
		}
		e.enqueue(msgs...)
		claimers := 2
		if h.Features.ConcurrentWriters {
			claimers = 8
		}
		var got set
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, claimers)
		for c := range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := fmt.Sprintf("claimer-%d", c)
				<-start
				for batch, err := range e.claimUntilNonePending(owner, 7) {
					if err != nil {
						errs <- err
						return
					}
					p := outbox.MessageFinishParams{Owner: owner, Now: e.t0}
					for _, m := range batch {
						got.add(m.ID)
						if m.ClaimedBy != owner {
							errs <- fmt.Errorf("%s got a message leased to %q", owner, m.ClaimedBy)
							return
						}
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
					}
					res, err := e.s.MessageFinish(e.ctx, p)
					if err != nil || len(res.LeaseLost) > 0 {
						errs <- fmt.Errorf("finish: %v, lease lost %v", err, res.LeaseLost)
						return
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if d := got.dups(); len(d) > 0 {
			t.Fatalf("%d messages were claimed twice: %v", len(d), d)
		}
		if len(got.n) != n {
			t.Fatalf("claimed %d distinct messages, want %d", len(got.n), n)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: n})
	})
}

func testFIFO[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("ProcessingMessageBlocksItsGroup", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueue(msg("t", "g", 1), msg("t", "g", 2), msg("t", "", 3), msg("t", "h", 4), msg("t", "g", 5))
		wantIDs(t, "first claim", e.claim("p1", 1, e.t0), ms[0])
		// g is blocked by ms[0]; the unordered message and group h flow.
		wantIDs(t, "second claim", e.claim("p2", 10, e.t0), ms[2], ms[3])
		if got := e.claim("p2", 10, e.t0); len(got) != 0 {
			t.Fatalf("claimed %v while the head of g is PROCESSING", ids(got))
		}
		e.sent("p1", e.t0, e.get("", ms[0].ID))
		wantIDs(t, "after the head was sent", e.claim("p2", 10, e.t0), ms[1], ms[4])
	})

	t.Run("RetryBlocksItsGroup", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		ms := e.enqueue(msg("t", "g", 1), msg("t", "g", 2), msg("t", "", 3))
		c := e.claim("p", 1, e.t0)
		wantIDs(t, "first claim", c, ms[0])
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeRetry, ID: ms[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, NextAttemptAt: e.at(time.Hour), Error: &outbox.ErrorInfo{Code: "503", Message: "down"},
		}}})
		// ms[1] is due but must wait behind the retry of ms[0].
		wantIDs(t, "claim while the head waits for its retry", e.claim("p", 10, e.at(time.Minute)), ms[2])
		if got := e.claim("p", 10, e.at(59*time.Minute)); len(got) != 0 {
			t.Fatalf("claimed %v while the head of g waits for its retry", ids(got))
		}
		// When the retry is due, the head and what follows it come in order.
		got := e.claim("p", 10, e.at(time.Hour))
		wantIDs(t, "claim when the retry is due", got, ms[0], ms[1])
		if got[0].Attempts != 2 || got[1].Attempts != 1 {
			t.Fatalf("attempts %d, %d; want 2, 1", got[0].Attempts, got[1].Attempts)
		}
	})

	t.Run("DelayedMessageBlocksLaterOnes", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		delayed := msg("t", "g", 2)
		delayed.NextAttemptAt = e.at(time.Hour)
		ms := e.enqueue(msg("t", "g", 1), delayed, msg("t", "g", 3))
		wantIDs(t, "claim before the delay", e.claim("p", 10, e.t0), ms[0])
		e.sent("p", e.t0, e.get("", ms[0].ID))
		if got := e.claim("p", 10, e.at(time.Minute)); len(got) != 0 {
			t.Fatalf("claimed %v past a message of its group that is not due", ids(got))
		}
		wantIDs(t, "claim after the delay", e.claim("p", 10, e.at(time.Hour)), ms[1], ms[2])
	})

	t.Run("OnlyAContiguousPrefixIsClaimed", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 4)
		c := e.claim("p1", 2, e.t0)
		wantIDs(t, "claim with limit 2", c, ms[0], ms[1])
		if got := e.claim("p2", 10, e.t0); len(got) != 0 {
			t.Fatalf("p2 claimed %v while p1 holds the head of the group", ids(got))
		}
		// Releasing the prefix (not started) puts it back in front.
		e.finish(outbox.MessageFinishParams{Owner: "p1", Now: e.t0, Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeReleased, ID: ms[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken}, {Kind: outbox.OutcomeReleased, ID: ms[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken},
		}})
		wantIDs(t, "claim after release", e.claim("p2", 10, e.t0), ms...)
	})

	t.Run("GroupIsTenantTopicAndGroup", func(t *testing.T) {
		need(t, h, CapTenants)
		e := setup(t, h)
		a := e.enqueue(outbox.Message{Tenant: "a", Topic: "t", Group: "g", Payload: []byte(`1`)})[0]
		rest := e.enqueue(
			outbox.Message{Tenant: "b", Topic: "t", Group: "g", Payload: []byte(`2`)},
			outbox.Message{Tenant: "a", Topic: "u", Group: "g", Payload: []byte(`3`)},
			outbox.Message{Tenant: "a", Topic: "t", Group: "g2", Payload: []byte(`4`)},
			outbox.Message{Tenant: "a", Topic: "t", Group: "g", Payload: []byte(`5`)},
		)
		wantIDs(t, "first claim", e.claim("p", 1, e.t0), a)
		wantIDs(t, "second claim", e.claim("p", 10, e.t0), rest[0], rest[1], rest[2])
	})

	t.Run("UnorderedNeverBlocks", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "", 3)
		c := e.claim("p", 1, e.t0)
		wantIDs(t, "first claim", c, ms[0])
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeRetry, ID: ms[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, NextAttemptAt: e.at(time.Hour), Error: &outbox.ErrorInfo{Code: "x"},
		}}})
		wantIDs(t, "second claim", e.claim("p", 1, e.t0), ms[1])
		wantIDs(t, "third claim", e.claim("p", 10, e.t0), ms[2])
	})

	t.Run("DeadLetterAndCancelUnblock", func(t *testing.T) {
		need(t, h, CapCancel)
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 3)
		// An outcome for a message nobody claimed is refused.
		res := e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeDead, ID: ms[0].ID, Attempt: 1, Error: &outbox.ErrorInfo{Code: "131047"},
		}}})
		if len(res.LeaseLost) != 1 || res.LeaseLost[0] != ms[0].ID {
			t.Fatalf("LeaseLost %v, want [%s]", res.LeaseLost, ms[0].ID)
		}
		e.wantStatus("", ms[0].ID, outbox.StatusPending)
		c := e.claim("p", 1, e.t0)
		wantIDs(t, "claim", c, ms[0])
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeDead, ID: ms[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, Error: &outbox.ErrorInfo{Code: "131047"},
		}}})
		if _, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{ID: ms[1].ID, Now: e.t0}); err != nil {
			t.Fatalf("MessageCancel: %v", err)
		}
		wantIDs(t, "claim after a dead letter and a cancel", e.claim("p", 10, e.t0), ms[2])
	})

	t.Run("ConcurrentClaimersWithRetriesAndReleases", func(t *testing.T) { testFIFOUnderChurn(t, h) })

	t.Run("ConcurrentClaimersKeepGroupOrder", func(t *testing.T) {
		need(t, h, CapConcurrentClaim)
		e := setup(t, h)
		const groups, perGroup = 10, 20
		var msgs []outbox.Message
		for i := range groups * perGroup {
			msgs = append(msgs, msg("t", fmt.Sprintf("g%d", i%groups), i/groups))
		}
		stored := e.enqueue(msgs...)
		index := map[string]int{} // ID -> position in its group
		for i, m := range stored {
			index[m.ID] = i / groups
		}
		claimers := 2
		if h.Features.ConcurrentWriters {
			claimers = 6
		}
		var (
			mu     sync.Mutex
			holder = map[string]string{} // group -> claimer holding its head
			next   = map[string]int{}    // group -> position expected next
		)
		errs := make(chan error, claimers)
		var wg sync.WaitGroup
		for c := range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := fmt.Sprintf("claimer-%d", c)
				for batch, err := range e.claimUntilNonePending(owner, 5) {
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					mine := map[string]bool{}
					for _, m := range batch {
						if hd := holder[m.Group]; hd != "" && hd != owner {
							mu.Unlock()
							errs <- fmt.Errorf("%s claimed %s of group %s while %s holds the group", owner, m.ID, m.Group, hd)
							return
						}
						if index[m.ID] != next[m.Group] {
							mu.Unlock()
							errs <- fmt.Errorf("%s claimed position %d of group %s, want %d", owner, index[m.ID], m.Group, next[m.Group])
							return
						}
						holder[m.Group], mine[m.Group] = owner, true
						next[m.Group]++
					}
					for g := range mine {
						delete(holder, g) // released before the outcome commits
					}
					mu.Unlock()
					p := outbox.MessageFinishParams{Owner: owner, Now: e.t0}
					for _, m := range batch {
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
					}
					if res, err := e.s.MessageFinish(e.ctx, p); err != nil || len(res.LeaseLost) > 0 {
						errs <- fmt.Errorf("finish: %v, lease lost %v", err, res.LeaseLost)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: groups * perGroup})
	})
}

// testFIFOUnderChurn runs concurrent claimers that send, retry (due almost at
// once) or release what they claim, at random, and checks at every claim
// that each claimed message's earlier group mates are all sent or claimed in
// the same call.
func testFIFOUnderChurn[TTx any](t *testing.T, h Harness[TTx]) {
	need(t, h, CapConcurrentClaim)
	e := setup(t, h)
	const groups, perGroup = 8, 25
	var msgs []outbox.Message
	for i := range groups * perGroup {
		msgs = append(msgs, msg("t", fmt.Sprintf("g%d", i%groups), i/groups))
	}
	stored := e.enqueue(msgs...)
	pos := map[string]int{}
	byGroup := map[string][]string{}
	for _, m := range stored {
		pos[m.ID] = len(byGroup[m.Group])
		byGroup[m.Group] = append(byGroup[m.Group], m.ID)
	}
	claimers := 3
	if h.Features.ConcurrentWriters {
		claimers = 6
	}
	var (
		mu    sync.Mutex
		done  = map[string]bool{}
		total int
	)
	errs := make(chan error, claimers)
	var wg sync.WaitGroup
	for c := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("claimer-%d", c)
			rng := uint64(c*7919 + 1)
			next := func(n uint64) uint64 { rng = rng*6364136223846793005 + 1442695040888963407; return (rng >> 33) % n }
			idle := 0
			for {
				now := time.Now().UTC()
				batch, err := e.s.MessageClaim(e.ctx, outbox.MessageClaimParams{Limit: 1 + int(next(6)), Owner: owner, Now: now})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if total == groups*perGroup {
					mu.Unlock()
					return
				}
				inBatch := map[string]bool{}
				for _, m := range batch {
					inBatch[m.ID] = true
				}
				for _, m := range batch {
					for _, earlier := range byGroup[m.Group][:pos[m.ID]] {
						if !done[earlier] && !inBatch[earlier] {
							mu.Unlock()
							errs <- fmt.Errorf("%s claimed position %d of %s while position %d is neither sent nor in the claim",
								owner, pos[m.ID], m.Group, pos[earlier])
							return
						}
					}
				}
				p := outbox.MessageFinishParams{Owner: owner, Now: now}
				stopped := map[string]bool{}
				for _, m := range batch {
					switch r := next(10); {
					case stopped[m.Group]:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
					case r < 2:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeRetry, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, NextAttemptAt: now.Add(time.Millisecond), Error: &outbox.ErrorInfo{Code: "x"}})
						stopped[m.Group] = true
					case r < 3:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
						stopped[m.Group] = true
					default:
						p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
						done[m.ID] = true // before the outcome commits
						total++
					}
				}
				mu.Unlock()
				if len(batch) == 0 {
					idle++
					if idle > 2000 {
						errs <- fmt.Errorf("%s: no progress", owner)
						return
					}
					time.Sleep(time.Millisecond)
					continue
				}
				idle = 0
				if res, err := e.s.MessageFinish(e.ctx, p); err != nil || len(res.LeaseLost) > 0 {
					errs <- fmt.Errorf("finish: %v, lease lost %v", err, res.LeaseLost)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: groups * perGroup})
}
