package storetest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

func testFinish[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("Sent", func(t *testing.T) {
		need(t, h, CapTenants, CapAttemptHistory)
		e := setup(t, h)
		m := e.enqueue(outbox.Message{Tenant: "a", Topic: "t", Payload: []byte(`1`)})[0]
		c := e.claim("p", 1, e.at(time.Second))[0]
		res := e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.at(2 * time.Second), Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeSent, ID: c.ID, Attempt: c.Attempts, ClaimToken: c.ClaimToken, ProviderMessageID: "wamid.1",
			ProviderResponse: json.RawMessage(`{"messages":[{"id":"wamid.1"}]}`), StartedAt: e.at(time.Second),
		}}})
		if len(res.LeaseLost) != 0 {
			t.Fatalf("LeaseLost %v", res.LeaseLost)
		}
		got := e.wantStatus("a", m.ID, outbox.StatusSent)
		if got.ProviderMessageID != "wamid.1" || got.Attempts != 1 || got.ClaimedBy != "" || !got.ClaimedAt.IsZero() {
			t.Fatalf("sent message: %+v; want provider ID wamid.1, 1 attempt, no lease", got)
		}
		wantTime(t, "SentAt", got.SentAt, e.at(2*time.Second))
		wantTime(t, "UpdatedAt", got.UpdatedAt, e.at(2*time.Second))
		as := e.attempts("a", m.ID)
		if len(as) != 1 {
			t.Fatalf("%d attempts recorded, want 1", len(as))
		}
		a := as[0]
		if a.MessageID != m.ID || a.Tenant != "a" || a.Number != 1 || a.Outcome != outbox.AttemptSucceeded || a.Error != nil ||
			!jsonEqual(a.ProviderResponse, []byte(`{"messages":[{"id":"wamid.1"}]}`)) {
			t.Fatalf("attempt: %+v", a)
		}
		wantTime(t, "attempt StartedAt", a.StartedAt, e.at(time.Second))
		wantTime(t, "attempt FinishedAt", a.FinishedAt, e.at(2*time.Second))
		if got := e.claim("p", 10, e.at(time.Hour)); len(got) != 0 {
			t.Fatal("a SENT message was claimed again")
		}
	})

	t.Run("RetryThenSucceed", func(t *testing.T) {
		need(t, h, CapAttemptHistory)
		e := setup(t, h)
		m := e.enqueue(msg("t", "", 1))[0]
		c := e.claim("p", 1, e.t0)[0]
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.at(time.Second), Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeRetry, ID: c.ID, Attempt: 1, ClaimToken: c.ClaimToken, NextAttemptAt: e.at(time.Minute), Error: &outbox.ErrorInfo{Code: "http_503", Message: "unavailable"},
			StartedAt: e.t0,
		}}})
		got := e.wantStatus("", m.ID, outbox.StatusPending)
		if got.Attempts != 1 || got.LastError == nil || got.LastError.Code != "http_503" || got.LastError.Message != "unavailable" || got.ClaimedBy != "" {
			t.Fatalf("retried message: %+v (last error %+v)", got, got.LastError)
		}
		wantTime(t, "NextAttemptAt", got.NextAttemptAt, e.at(time.Minute))
		if c := e.claim("p", 1, e.at(59*time.Second)); len(c) != 0 {
			t.Fatal("claimed before NextAttemptAt")
		}
		c = e.claim("p", 1, e.at(time.Minute))[0]
		if c.Attempts != 2 {
			t.Fatalf("second claim: attempts %d, want 2", c.Attempts)
		}
		e.sent("p", e.at(2*time.Minute), c)
		as := e.attempts("", m.ID)
		if len(as) != 2 || as[0].Number != 1 || as[0].Outcome != outbox.AttemptRetry || as[0].Error == nil || as[0].Error.Code != "http_503" ||
			as[1].Number != 2 || as[1].Outcome != outbox.AttemptSucceeded {
			t.Fatalf("attempts: %+v", as)
		}
		wantTime(t, "retry attempt NextAttemptAt", as[0].NextAttemptAt, e.at(time.Minute))
	})

	t.Run("Dead", func(t *testing.T) {
		need(t, h, CapAttemptHistory)
		e := setup(t, h)
		m := e.enqueue(msg("t", "", 1))[0]
		c := e.claim("p", 1, e.t0)[0]
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeDead, ID: c.ID, Attempt: 1, ClaimToken: c.ClaimToken, Error: &outbox.ErrorInfo{Code: "131047", Message: "invalid parameter"},
		}}})
		got := e.wantStatus("", m.ID, outbox.StatusFailed)
		if got.LastError == nil || got.LastError.Code != "131047" || got.ClaimedBy != "" {
			t.Fatalf("dead letter: %+v", got)
		}
		as := e.attempts("", m.ID)
		if len(as) != 1 || as[0].Outcome != outbox.AttemptFailed || as[0].Error == nil || as[0].Error.Message != "invalid parameter" {
			t.Fatalf("attempts: %+v", as)
		}
		if got := e.claim("p", 10, e.at(time.Hour)); len(got) != 0 {
			t.Fatal("a FAILED message was claimed")
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusFailed: 1})
	})

	t.Run("ReleasedUncountsTheAttempt", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		delayed := msg("t", "", 1)
		delayed.NextAttemptAt = e.at(time.Minute)
		m := e.enqueue(delayed)[0]
		c := e.claim("p", 1, e.at(time.Minute))[0]
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.at(2 * time.Minute), Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeReleased, ID: c.ID, Attempt: c.Attempts, ClaimToken: c.ClaimToken}}})
		got := e.wantStatus("", m.ID, outbox.StatusPending)
		if got.Attempts != 0 || got.ClaimedBy != "" || !got.ClaimedAt.IsZero() {
			t.Fatalf("released: %+v; want 0 attempts and no lease", got)
		}
		wantTime(t, "NextAttemptAt (unchanged)", got.NextAttemptAt, e.at(time.Minute))
		if as := e.attempts("", m.ID); len(as) != 0 {
			t.Fatalf("a release recorded attempts: %+v", as)
		}
		if c := e.claim("q", 1, e.at(2*time.Minute)); len(c) != 1 || c[0].Attempts != 1 {
			t.Fatalf("claim after release: %+v; want it again with attempt 1", c)
		}
	})

	t.Run("DeferredRelease", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 2)
		c := e.claim("p", 1, e.t0)[0]
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{
			Kind: outbox.OutcomeReleased, ID: c.ID, Attempt: 1, ClaimToken: c.ClaimToken, NextAttemptAt: e.at(time.Hour), Error: &outbox.ErrorInfo{Code: "quota", Message: "daily quota used up"},
		}}})
		got := e.wantStatus("", ms[0].ID, outbox.StatusPending)
		if got.Attempts != 0 || got.LastError == nil || got.LastError.Code != "quota" || got.ClaimedBy != "" {
			t.Fatalf("deferred: %+v (last error %+v); want 0 attempts and LastError quota", got, got.LastError)
		}
		wantTime(t, "deferred NextAttemptAt", got.NextAttemptAt, e.at(time.Hour))
		if as := e.attempts("", ms[0].ID); len(as) != 0 {
			t.Fatalf("a deferral recorded attempts: %+v", as)
		}
		// The deferred head blocks its group until it is due.
		if got := e.claim("p", 10, e.at(time.Minute)); len(got) != 0 {
			t.Fatalf("claimed %v while the head of the group is deferred", ids(got))
		}
		got2 := e.claim("p", 10, e.at(time.Hour))
		wantIDs(t, "claim when the deferral ends", got2, ms...)
		if got2[0].Attempts != 1 {
			t.Fatalf("attempts after a deferral: %d, want 1", got2[0].Attempts)
		}
	})

	t.Run("StaleOwnerIsFenced", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		ms := e.enqueueN("t", "", 3)
		old := e.claim("old", 3, e.t0)
		// The lease of "old" expires; "new" takes the first two over.
		if _, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: e.at(time.Minute), Now: e.at(time.Minute), MaxAttempts: 5}); err != nil {
			t.Fatal(err)
		}
		fresh := e.claim("new", 2, e.at(time.Minute))
		wantIDs(t, "new claim", fresh, ms[0], ms[1])

		res := e.finish(outbox.MessageFinishParams{Owner: "old", Now: e.at(2 * time.Minute),
			Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: old[0].ID, Attempt: 1, ClaimToken: old[0].ClaimToken, ProviderMessageID: "stale"},
				{Kind: outbox.OutcomeRetry, ID: old[1].ID, Attempt: 1, ClaimToken: old[1].ClaimToken, NextAttemptAt: e.at(time.Hour), Error: &outbox.ErrorInfo{Code: "x"}},
				{Kind: outbox.OutcomeReleased, ID: old[2].ID, Attempt: 1, ClaimToken: old[2].ClaimToken}}, // recovered: PENDING, not PROCESSING
		})
		slices.Sort(res.LeaseLost)
		want := []string{ms[0].ID, ms[1].ID, ms[2].ID}
		slices.Sort(want)
		if !slices.Equal(res.LeaseLost, want) {
			t.Fatalf("LeaseLost %v, want %v", res.LeaseLost, want)
		}
		for i, m := range fresh {
			got := e.wantStatus("", m.ID, outbox.StatusProcessing)
			if got.ClaimedBy != "new" || got.Attempts != 1 || got.ProviderMessageID != "" {
				t.Fatalf("message %d after a stale outcome: %+v", i, got)
			}
		}
		if got := e.wantStatus("", ms[2].ID, outbox.StatusPending); got.Attempts != 0 {
			t.Fatalf("a stale release changed attempts to %d (recovery left 0)", got.Attempts)
		}
		// Right owner, wrong attempt; and wrong owner, right attempt.
		res = e.finish(outbox.MessageFinishParams{Owner: "new", Now: e.at(2 * time.Minute), Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: fresh[0].ID, Attempt: 2, ClaimToken: fresh[0].ClaimToken}}})
		if len(res.LeaseLost) != 1 {
			t.Fatalf("an outcome for attempt 2 of a message at attempt 1 was applied")
		}
		res = e.finish(outbox.MessageFinishParams{Owner: "old", Now: e.at(2 * time.Minute), Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: fresh[0].ID, Attempt: 1, ClaimToken: fresh[0].ClaimToken}}})
		if len(res.LeaseLost) != 1 {
			t.Fatalf("an outcome from another owner was applied")
		}
		// The stale outcomes left no SUCCEEDED attempt behind.
		for _, a := range e.attempts("", fresh[0].ID) {
			if a.Outcome == outbox.AttemptSucceeded {
				t.Fatalf("a fenced outcome recorded an attempt: %+v", a)
			}
		}
		// The live owner still finishes.
		e.sent("new", e.at(3*time.Minute), fresh...)
	})

	// A message released (or recovered) and claimed again by the same
	// owner has the same owner and attempt as before: only the claim
	// token tells the two claims apart. A late outcome of the first claim
	// (a write retried after its commit's answer was lost, an outcome
	// written after the lease expired) must not finish the second: a
	// release would put the message back to PENDING while it is published,
	// and another processor would publish it again.
	t.Run("ReclaimFencesEarlierClaim", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "", 4)
		first := e.claim("p", 4, e.t0)
		wantIDs(t, "first claim", first, ms...)
		rel := outbox.MessageFinishParams{Owner: "p", Now: e.t0}
		for _, c := range first {
			rel.Outcomes = append(rel.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, Topic: c.Topic, ID: c.ID, Attempt: c.Attempts, ClaimToken: c.ClaimToken})
		}
		if res := e.finish(rel); len(res.LeaseLost) != 0 {
			t.Fatalf("release: LeaseLost %v", res.LeaseLost)
		}
		second := e.claim("p", 4, e.t0)
		wantIDs(t, "claim after the release", second, ms...)
		for i := range second {
			if second[i].Attempts != first[i].Attempts {
				t.Fatalf("message %d: attempt %d, then %d after a release; want the same", i, first[i].Attempts, second[i].Attempts)
			}
			if second[i].ClaimToken == "" || second[i].ClaimToken == first[i].ClaimToken {
				t.Fatalf("message %d: claim token %q, then %q; want a new one for each claim", i, first[i].ClaimToken, second[i].ClaimToken)
			}
			if got := e.get("", ms[i].ID); got.ClaimToken != second[i].ClaimToken {
				t.Fatalf("message %d: stored claim token %q, claim returned %q", i, got.ClaimToken, second[i].ClaimToken)
			}
		}
		// The first claim's outcomes, late: one of each kind.
		late := outbox.MessageFinishParams{Owner: "p", Now: e.at(time.Second), Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeReleased, Topic: first[0].Topic, ID: first[0].ID, Attempt: first[0].Attempts, ClaimToken: first[0].ClaimToken},
			{Kind: outbox.OutcomeSent, Topic: first[1].Topic, ID: first[1].ID, Attempt: first[1].Attempts, ClaimToken: first[1].ClaimToken, ProviderMessageID: "late"},
			{Kind: outbox.OutcomeRetry, Topic: first[2].Topic, ID: first[2].ID, Attempt: first[2].Attempts, ClaimToken: first[2].ClaimToken, NextAttemptAt: e.at(time.Hour), Error: &outbox.ErrorInfo{Code: "late"}},
			{Kind: outbox.OutcomeDead, Topic: first[3].Topic, ID: first[3].ID, Attempt: first[3].Attempts, ClaimToken: first[3].ClaimToken, Error: &outbox.ErrorInfo{Code: "late"}},
		}}
		res := e.finish(late)
		lost := slices.Sorted(slices.Values(res.LeaseLost))
		if want := slices.Sorted(slices.Values(ids(ms))); !slices.Equal(lost, want) {
			t.Fatalf("late outcomes of the first claim: LeaseLost %v, want every message %v (the second claim holds them)", lost, want)
		}
		for i, m := range ms {
			got := e.wantStatus("", m.ID, outbox.StatusProcessing)
			if got.ClaimedBy != "p" || got.Attempts != second[i].Attempts || got.ProviderMessageID != "" {
				t.Fatalf("message %d after a late outcome of the first claim: %+v; want the second claim's lease", i, got)
			}
		}
		if c := e.claim("q", 4, e.at(2*time.Hour)); len(c) != 0 {
			t.Fatalf("another processor claimed %v while the second claim holds them", ids(c))
		}
		// The second claim's own outcomes apply.
		e.sent("p", e.at(2*time.Second), second...)
	})

	t.Run("ReclaimAfterRecoveryFencesEarlierClaim", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		m := e.enqueueN("t", "", 1)[0]
		first := e.claim("p", 1, e.t0)[0]
		// The lease of the first claim expires and is recovered (the
		// attempt is given back); the same processor claims it again.
		rec, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: e.at(time.Minute), Now: e.at(time.Minute), MaxAttempts: 5})
		if err != nil || rec.Recovered != 1 {
			t.Fatalf("MessageRecover: %+v, %v; want 1 recovered", rec, err)
		}
		second := e.claim("p", 1, e.at(time.Minute))
		wantIDs(t, "claim after the recovery", second, m)
		if second[0].Attempts != first.Attempts {
			t.Fatalf("attempt %d, then %d after a recovery; want the same", first.Attempts, second[0].Attempts)
		}
		if ext, ok := e.s.(outbox.LeaseExtender); ok && !h.lacks(CapLeaseExtend) {
			r, err := ext.MessageExtendLease(e.ctx, outbox.MessageExtendLeaseParams{Owner: "p", Now: e.at(2 * time.Minute),
				Leases: []outbox.Lease{{Topic: first.Topic, ID: first.ID, Attempt: first.Attempts, ClaimToken: first.ClaimToken}}})
			if err != nil || len(r.LeaseLost) != 1 {
				t.Fatalf("extending the first claim's lease: %+v, %v; want it lost", r, err)
			}
			wantTime(t, "ClaimedAt of the second claim", e.get("", m.ID).ClaimedAt, e.at(time.Minute))
		}
		res := e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.at(2 * time.Minute), Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeReleased, Topic: first.Topic, ID: first.ID, Attempt: first.Attempts, ClaimToken: first.ClaimToken},
		}})
		if len(res.LeaseLost) != 1 {
			t.Fatalf("a late release of the first claim was applied to the second (LeaseLost %v)", res.LeaseLost)
		}
		if got := e.wantStatus("", m.ID, outbox.StatusProcessing); got.ClaimedBy != "p" {
			t.Fatalf("after a late outcome of the first claim: %+v", got)
		}
		e.sent("p", e.at(3*time.Minute), second...)
	})

	t.Run("MixedBatch", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "", 4)
		c := e.claim("p", 4, e.t0)
		res := e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.at(time.Second),
			Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, ProviderMessageID: "x0"},
				{Kind: outbox.OutcomeRetry, ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken, NextAttemptAt: e.at(time.Minute), Error: &outbox.ErrorInfo{Code: "r"}},
				{Kind: outbox.OutcomeDead, ID: c[2].ID, Attempt: 1, ClaimToken: c[2].ClaimToken, Error: &outbox.ErrorInfo{Code: "d"}},
				{Kind: outbox.OutcomeReleased, ID: c[3].ID, Attempt: 1, ClaimToken: c[3].ClaimToken}},
		})
		if len(res.LeaseLost) != 0 {
			t.Fatalf("LeaseLost %v", res.LeaseLost)
		}
		e.wantStatus("", ms[0].ID, outbox.StatusSent)
		e.wantStatus("", ms[1].ID, outbox.StatusPending)
		e.wantStatus("", ms[2].ID, outbox.StatusFailed)
		e.wantStatus("", ms[3].ID, outbox.StatusPending)
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: 1, outbox.StatusPending: 2, outbox.StatusFailed: 1})
		if _, err := e.s.MessageFinish(e.ctx, outbox.MessageFinishParams{Now: e.t0, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: ms[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken}}}); err == nil {
			t.Fatal("MessageFinish without an Owner was accepted")
		}
	})

	t.Run("InvalidOutcomeChangesNothing", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "", 2)
		c := e.claim("p", 2, e.t0)
		_, err := e.s.MessageFinish(e.ctx, outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeSent, ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken},
			{Kind: outbox.OutcomeDead, ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken}, // no Error: a dead letter must say why
		}})
		wantErrIs(t, "MessageFinish with a dead letter without Error", err, outbox.ErrInvalidInput)
		e.wantStatus("", ms[0].ID, outbox.StatusProcessing)
		e.wantStatus("", ms[1].ID, outbox.StatusProcessing)
	})
}

func testRecover[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("ExpiredLeasesOnly", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 1)
		other := e.enqueueN("t", "", 1)
		e.claim("dead-processor", 1, e.t0)
		e.claim("live-processor", 1, e.at(10*time.Minute))
		res, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: e.at(5 * time.Minute), Now: e.at(15 * time.Minute), MaxAttempts: 5})
		require.NoError(t, err)
		if res.Recovered != 1 || res.DeadLettered != 0 {
			t.Fatalf("MessageRecover: %+v, want 1 recovered", res)
		}
		got := e.wantStatus("", ms[0].ID, outbox.StatusPending)
		if got.ClaimedBy != "" || got.Attempts != 0 {
			t.Fatalf("recovered message: %+v; want no lease and the lost attempt not counted", got)
		}
		if got := e.wantStatus("", other[0].ID, outbox.StatusProcessing); got.ClaimedBy != "live-processor" {
			t.Fatalf("a live lease was touched: %+v", got)
		}
		c := e.claim("p", 10, e.at(15*time.Minute))
		wantIDs(t, "claim after recovery", c, ms[0])
		if c[0].Attempts != 1 {
			t.Fatalf("attempts %d, want 1 (the recovered claim is not counted)", c[0].Attempts)
		}
		res, err = e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: e.at(5 * time.Minute), Now: e.at(15 * time.Minute), MaxAttempts: 5})
		if err != nil || res.Recovered != 0 || res.DeadLettered != 0 {
			t.Fatalf("second MessageRecover: %+v, %v; want nothing", res, err)
		}
		if h.lacks(CapAttemptHistory) {
			return
		}
		// The history keeps the lost claim, then the success, in order.
		e.sent("p", e.at(16*time.Minute), c[0])
		as := e.attempts("", ms[0].ID)
		if len(as) != 2 || as[0].Outcome != outbox.AttemptRetry || as[0].Error == nil || as[0].Error.Code != "lease_expired" ||
			as[1].Outcome != outbox.AttemptSucceeded || as[0].Number != 1 || as[1].Number != 1 {
			t.Fatalf("attempts after a recovery and a success: %+v; want the lost claim (1, lease_expired) then the success (1)", as)
		}
	})

	t.Run("RecoveriesBoundedThenDeadLetter", func(t *testing.T) {
		need(t, h, CapAttemptHistory)
		e := setup(t, h)
		own := msg("t", "", 1)
		own.MaxAttempts = 1 // recoveries do not use it up
		ms := e.enqueue(own, msg("t", "", 2))
		// ms[1] has one real (retried) attempt before its leases are lost.
		c := e.claim("p", 2, e.t0)
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeRetry, ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken, NextAttemptAt: e.t0, Error: &outbox.ErrorInfo{Code: "x"}},
			{Kind: outbox.OutcomeReleased, ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken},
		}})
		const maxRecoveries = 3
		now := e.t0
		for round := 1; round <= maxRecoveries; round++ {
			// A processor claims and dies, again and again (a message that
			// crashes its processors).
			c := e.claim(fmt.Sprintf("doomed-%d", round), 2, now)
			wantIDs(t, fmt.Sprintf("claim %d", round), c, ms...)
			if c[0].Attempts != 1 || c[1].Attempts != 2 {
				t.Fatalf("claim %d: attempts %d and %d, want 1 and 2 (recoveries counted as attempts)", round, c[0].Attempts, c[1].Attempts)
			}
			now = now.Add(10 * time.Minute)
			res, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: now.Add(-time.Minute), Now: now, MaxRecoveries: maxRecoveries})
			require.NoError(t, err)
			if round < maxRecoveries {
				if res.Recovered != 2 || res.DeadLettered != 0 {
					t.Fatalf("recovery %d: %+v, want 2 recovered", round, res)
				}
				for i, want := range []int{0, 1} {
					if got := e.wantStatus("", ms[i].ID, outbox.StatusPending); got.Attempts != want {
						t.Fatalf("recovery %d, message %d: attempts %d, want %d", round, i, got.Attempts, want)
					}
				}
				continue
			}
			if res.Recovered != 0 || res.DeadLettered != 2 {
				t.Fatalf("recovery %d: %+v, want 2 dead-lettered", round, res)
			}
		}
		for _, m := range ms {
			got := e.wantStatus("", m.ID, outbox.StatusFailed)
			if got.LastError == nil || got.LastError.Code != "lease_expired" || got.ClaimedBy != "" {
				t.Fatalf("dead-lettered by recovery: %+v (last error %+v); want code lease_expired", got, got.LastError)
			}
		}
		// A requeue starts the count again.
		_, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{ID: ms[0].ID, Now: now})
		require.NoError(t, err)
		e.claim("doomed-again", 1, now)
		now = now.Add(10 * time.Minute)
		if res, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: now.Add(-time.Minute), Now: now, MaxRecoveries: maxRecoveries}); err != nil || res.Recovered != 1 {
			t.Fatalf("recovery after a requeue: %+v, %v; want 1 recovered", res, err)
		}
	})

	t.Run("SparesNewerClaimOfSameOwner", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		const n, rounds = 20, 10
		ms := e.enqueueN("t", "", n)
		// Round k: the owner's leases, taken at k hours, have expired
		// (recovery frees what was claimed before k hours 30); while a
		// recovery runs, the owner releases them and claims the messages
		// again at k hours 50, as a processor does after a store stall.
		// A release gives the attempt back, so the new leases have the
		// owner and attempt of the expired ones: a recovery that read an
		// expired lease must not free the new lease that replaced it
		// before its write (the rows it read are locked, or its write is
		// fenced by the lease it read, ClaimedAt or token). Each expired
		// lease is either recovered (its release is then refused) or
		// released; every new lease is held until its own release.
		var round atomic.Int64
		round.Store(-1)
		stop := make(chan struct{})
		recErr := make(chan error, 1)
		go func() {
			defer close(recErr)
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := round.Load()
				if k < 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				before := e.at(time.Duration(k)*time.Hour + 30*time.Minute)
				if _, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: before, Now: before, MaxRecoveries: 1000}); err != nil {
					recErr <- err
					return
				}
			}
		}()
		defer func() {
			close(stop)
			require.NoError(t, <-recErr, "MessageRecover")
		}()
		recovered := 0
		for k := range rounds {
			start := time.Duration(k) * time.Hour
			old := e.claimAll("p", n, e.at(start))
			wantIDs(t, fmt.Sprintf("round %d: claim", k), old, ms...)
			round.Store(int64(k))
			p := outbox.MessageFinishParams{Owner: "p", Now: e.at(start + 40*time.Minute)}
			for _, m := range old {
				e.released(m)(&p)
			}
			recovered += len(e.finish(p).LeaseLost)
			fresh := e.claimAll("p", n, e.at(start+50*time.Minute))
			wantIDs(t, fmt.Sprintf("round %d: claim again", k), fresh, ms...)
			for i, m := range fresh {
				if m.Attempts != old[i].Attempts {
					t.Fatalf("round %d: attempt %d, then %d after a release or recovery; want the same", k, old[i].Attempts, m.Attempts)
				}
			}
			p = outbox.MessageFinishParams{Owner: "p", Now: e.at(start + 55*time.Minute)}
			for _, m := range fresh {
				e.released(m)(&p)
			}
			if lost := e.finish(p).LeaseLost; len(lost) > 0 {
				t.Fatalf("round %d: %d leases claimed after the recovery's cutoff lost (recovered while an expired lease of the same owner and attempt was being recovered): %v", k, len(lost), lost)
			}
		}
		t.Logf("%d of %d expired leases recovered before their release", recovered, n*rounds)
	})
}

// claimAll claims for owner at now until it holds n messages, and returns
// them in Seq order. A claim that returns fewer is not the end while
// another call runs (SKIP LOCKED skips the rows it holds, and a store may
// find a message freed meanwhile only at a later claim): it claims again,
// for up to 30 seconds.
func (e *env[TTx]) claimAll(owner string, n int, now time.Time) []outbox.Message {
	e.t.Helper()
	var got []outbox.Message
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n {
		got = append(got, e.claim(owner, n-len(got), now)...)
		if len(got) < n && time.Now().After(deadline) {
			break
		}
		if len(got) < n {
			time.Sleep(5 * time.Millisecond)
		}
	}
	slices.SortFunc(got, func(a, b outbox.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return got
}

func testOperator[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("RequeueDeadLetter", func(t *testing.T) {
		need(t, h, CapTenants, CapAttemptHistory)
		e := setup(t, h)
		m := e.enqueue(outbox.Message{Tenant: "a", Topic: "t", Payload: []byte(`1`)})[0]
		c := e.claim("p", 1, e.t0)[0]
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeDead, ID: c.ID, Attempt: 1, ClaimToken: c.ClaimToken, Error: &outbox.ErrorInfo{Code: "x"}}}})

		_, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{Tenant: "b", ID: m.ID, Now: e.at(time.Hour)})
		wantErrIs(t, "MessageRequeue from another tenant", err, outbox.ErrNotFound)
		e.wantStatus("a", m.ID, outbox.StatusFailed)

		got, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{Tenant: "a", ID: m.ID, Now: e.at(time.Hour)})
		require.NoError(t, err, "MessageRequeue")
		if got.Status != outbox.StatusPending || got.Attempts != 0 || got.ID != m.ID {
			t.Fatalf("requeued: %+v", got)
		}
		wantTime(t, "requeued NextAttemptAt", got.NextAttemptAt, e.at(time.Hour))
		stored := e.wantStatus("a", m.ID, outbox.StatusPending)
		if stored.Attempts != 0 {
			t.Fatalf("stored attempts %d, want 0", stored.Attempts)
		}
		c2 := e.claim("p", 1, e.at(time.Hour))
		if len(c2) != 1 || c2[0].Attempts != 1 {
			t.Fatalf("claim after requeue: %+v", c2)
		}
		// The history is kept.
		if as := e.attempts("a", m.ID); len(as) != 1 {
			t.Fatalf("attempts after requeue: %d, want the 1 earlier attempt", len(as))
		}
	})

	t.Run("RequeueRefusesOtherStatuses", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "", 3)
		c := e.claim("p", 2, e.t0)
		e.sent("p", e.t0, c[0]) // ms[0] SENT, ms[1] PROCESSING, ms[2] PENDING
		for i, want := range []outbox.Status{outbox.StatusSent, outbox.StatusProcessing, outbox.StatusPending} {
			_, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{ID: ms[i].ID, Now: e.t0})
			wantErrIs(t, "MessageRequeue of a "+string(want)+" message", err, outbox.ErrInvalidTransition)
			e.wantStatus("", ms[i].ID, want)
		}
		_, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{ID: "01ARZ3NDEKTSV4RRFFQ69G5FAV", Now: e.t0})
		wantErrIs(t, "MessageRequeue of an unknown ID", err, outbox.ErrNotFound)
	})

	t.Run("Cancel", func(t *testing.T) {
		need(t, h, CapTenants, CapCancel)
		e := setup(t, h)
		ms := e.enqueue(outbox.Message{Tenant: "a", Topic: "t", Payload: []byte(`1`)}, outbox.Message{Tenant: "a", Topic: "t", Payload: []byte(`2`)},
			outbox.Message{Tenant: "a", Topic: "t", Payload: []byte(`3`)})

		_, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{Tenant: "b", ID: ms[2].ID, Now: e.t0})
		wantErrIs(t, "MessageCancel from another tenant", err, outbox.ErrNotFound)
		e.wantStatus("a", ms[2].ID, outbox.StatusPending)

		got, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{Tenant: "a", ID: ms[2].ID, Now: e.at(time.Second)})
		require.NoError(t, err, "MessageCancel")
		if got.Status != outbox.StatusCancelled {
			t.Fatalf("cancelled: status %s", got.Status)
		}
		c := e.claim("p", 10, e.at(time.Hour))
		wantIDs(t, "claim after cancel", c, ms[0], ms[1])
		e.sent("p", e.at(time.Hour), c[0]) // ms[0] SENT, ms[1] PROCESSING
		for i, want := range []outbox.Status{outbox.StatusSent, outbox.StatusProcessing, outbox.StatusCancelled} {
			_, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{Tenant: "a", ID: ms[i].ID, Now: e.t0})
			wantErrIs(t, "MessageCancel of a "+string(want)+" message", err, outbox.ErrInvalidTransition)
			e.wantStatus("a", ms[i].ID, want)
		}
		_, err = e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{Tenant: "a", ID: "01ARZ3NDEKTSV4RRFFQ69G5FAV", Now: e.t0})
		wantErrIs(t, "MessageCancel of an unknown ID", err, outbox.ErrNotFound)
		wantCounts(t, e.count("a"), map[outbox.Status]int64{outbox.StatusSent: 1, outbox.StatusProcessing: 1, outbox.StatusCancelled: 1})
	})
}
