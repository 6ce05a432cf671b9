package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// testLease covers outbox.LeaseExtender: the fence, what an extension
// protects from recovery, and a processor whose publish outlasts
// ProcessingTimeout without a second processor publishing its messages.
func testLease[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("ExtendFencedByOwnerAndAttempt", func(t *testing.T) {
		need(t, h, CapLeaseExtend, CapCallerClock)
		e := setup(t, h)
		ext := e.extender()
		ms := e.enqueueN("t", "", 4)
		claimed := e.claim("p", 3, e.t0) // ms[0..2]; ms[3] stays PENDING
		wantIDs(t, "claim", claimed, ms[:3]...)
		res, err := ext.MessageExtendLease(e.ctx, outbox.MessageExtendLeaseParams{Owner: "p", Now: e.at(10 * time.Minute), Leases: []outbox.Lease{
			{Topic: "t", ID: ms[0].ID, Attempt: 1, ClaimToken: claimed[0].ClaimToken},
			{Topic: "t", ID: ms[1].ID, Attempt: 2, ClaimToken: claimed[1].ClaimToken}, // not this claim
			{Topic: "t", ID: ms[3].ID, Attempt: 1},                                    // not claimed at all
		}})
		if err != nil {
			t.Fatalf("MessageExtendLease: %v", err)
		}
		lost := slices.Sorted(slices.Values(res.LeaseLost))
		if want := slices.Sorted(slices.Values([]string{ms[1].ID, ms[3].ID})); !slices.Equal(lost, want) {
			t.Fatalf("LeaseLost %v, want %v", lost, want)
		}
		res, err = ext.MessageExtendLease(e.ctx, outbox.MessageExtendLeaseParams{Owner: "q", Now: e.at(10 * time.Minute),
			Leases: []outbox.Lease{{Topic: "t", ID: ms[2].ID, Attempt: 1, ClaimToken: claimed[2].ClaimToken}}})
		if err != nil || len(res.LeaseLost) != 1 || res.LeaseLost[0] != ms[2].ID {
			t.Fatalf("extension by another owner: %+v, %v; want its lease lost", res, err)
		}
		got := e.wantStatus("", ms[0].ID, outbox.StatusProcessing)
		wantTime(t, "extended ClaimedAt", got.ClaimedAt, e.at(10*time.Minute))
		if got.ClaimedBy != "p" || got.Attempts != 1 {
			t.Fatalf("extended message: %+v; want the same owner and attempt", got)
		}
		// Recovery takes the expired leases only: the extended one is live.
		rec, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{ClaimedBefore: e.at(5 * time.Minute), Now: e.at(15 * time.Minute), MaxAttempts: 5})
		if err != nil || rec.Recovered != 2 || rec.DeadLettered != 0 {
			t.Fatalf("MessageRecover: %+v, %v; want the 2 leases that were not extended", rec, err)
		}
		e.wantStatus("", ms[0].ID, outbox.StatusProcessing)
		e.wantStatus("", ms[1].ID, outbox.StatusPending)
		e.wantStatus("", ms[2].ID, outbox.StatusPending)
		e.sent("p", e.at(16*time.Minute), claimed[0])
		// A finished message's lease is gone.
		res, err = ext.MessageExtendLease(e.ctx, outbox.MessageExtendLeaseParams{Owner: "p", Now: e.at(17 * time.Minute),
			Leases: []outbox.Lease{{Topic: "t", ID: ms[0].ID, Attempt: 1, ClaimToken: claimed[0].ClaimToken}}})
		if err != nil || len(res.LeaseLost) != 1 {
			t.Fatalf("extension after the outcome: %+v, %v; want the lease lost", res, err)
		}
		e.wantStatus("", ms[0].ID, outbox.StatusSent)
	})

	t.Run("ExtendRefusesBadInput", func(t *testing.T) {
		need(t, h, CapLeaseExtend)
		e := setup(t, h)
		ext := e.extender()
		for name, p := range map[string]outbox.MessageExtendLeaseParams{
			"no owner":   {Now: e.t0, Leases: []outbox.Lease{{ID: "x", Attempt: 1}}},
			"no time":    {Owner: "p", Leases: []outbox.Lease{{ID: "x", Attempt: 1}}},
			"no ID":      {Owner: "p", Now: e.t0, Leases: []outbox.Lease{{Attempt: 1}}},
			"attempt 0":  {Owner: "p", Now: e.t0, Leases: []outbox.Lease{{ID: "x"}}},
			"same twice": {Owner: "p", Now: e.t0, Leases: []outbox.Lease{{ID: "x", Attempt: 1}, {ID: "x", Attempt: 1}}},
		} {
			_, err := ext.MessageExtendLease(e.ctx, p)
			wantErrIs(t, "MessageExtendLease with "+name, err, outbox.ErrInvalidInput)
		}
	})

	t.Run("ProcessorHoldsLeaseThroughSlowPublish", func(t *testing.T) {
		need(t, h, CapLeaseExtend)
		e := setup(t, h)
		groups := e.enqueueGroups("t", 3, 3)
		log := &pubLog{delay: 12 * time.Second}
		// Each publish takes 12 s against a 10 s lease (renewed every 2.5 s;
		// a lease this long leaves room for slow claims and renewals on a
		// loaded machine: with 5 s, a renewal delayed by over 3.75 s lost
		// leases on FerretDB while the whole suite ran), and a second
		// processor recovers expired leases every 50 ms: without the
		// heartbeat every message would be recovered and published again.
		stop := e.runProcessors(2, log.publisher(), outbox.Config{
			PollInterval: 50 * time.Millisecond, ProcessingTimeout: 10 * time.Second, RecoveryInterval: 50 * time.Millisecond,
		})
		e.waitFor(time.Minute, "every message sent", func(c map[outbox.Status]int64) bool { return c[outbox.StatusSent] == 3 })
		stop()
		entries := log.snapshot()
		var seen set
		for _, en := range entries {
			seen.add(en.id)
		}
		if d := seen.dups(); len(d) > 0 || len(entries) != 3 {
			t.Fatalf("%d publishes of 3 messages, published twice: %v", len(entries), d)
		}
		checkFIFO(t, groups, entries, false)
		for _, g := range groups {
			for _, id := range g {
				if m := e.get("", id); m.Attempts != 1 {
					t.Fatalf("message %s: %d attempts, want 1 (a lease was recovered)", id, m.Attempts)
				}
			}
		}
	})
}

// extender returns the store as an outbox.LeaseExtender, failing when it
// is not one.
func (e *env[TTx]) extender() outbox.LeaseExtender {
	e.t.Helper()
	ext, ok := e.s.(outbox.LeaseExtender)
	if !ok {
		e.t.Fatalf("the Store does not implement outbox.LeaseExtender; declare Features.Lacks %q", CapLeaseExtend)
	}
	return ext
}
