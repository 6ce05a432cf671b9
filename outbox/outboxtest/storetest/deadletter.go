package storetest

import (
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// testDeadLetter covers the dead-letter policies (outbox.DeadLetterRule): a
// dead letter recorded with BlockGroup holds its (tenant, topic, group)
// until it is requeued (then it is claimed first: the group keeps its
// order) or cancelled; other groups, tenants and unordered messages go on.
func testDeadLetter[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("BlockHoldsGroupUntilRequeue", func(t *testing.T) {
		need(t, h, CapDeadLetterBlock)
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 3)
		others := e.enqueue(msg("t", "h", 10), msg("t", "", 11))
		if !h.lacks(CapTenants) {
			b := msg("t", "g", 12) // same topic and group, another tenant
			b.Tenant = "b"
			others = append(others, e.enqueue(b)...)
		}
		c := e.claim("p", 3, e.t0)
		wantIDs(t, "claim of the group", c, ms...)
		// The processor's outcomes under DeadLetterBlock: the head is dead,
		// what it held of the group goes back unattempted.
		e.outcomes("p", e.t0, e.dead(c[0], true), e.released(c[1]), e.released(c[2]))
		if got := e.wantStatus("", ms[0].ID, outbox.StatusFailed); !got.BlocksGroup {
			t.Fatalf("dead letter recorded with BlockGroup: BlocksGroup false, want true (%+v)", got)
		}
		// Other groups, unordered messages and other tenants are not held.
		got := e.claim("p", 10, e.at(time.Minute))
		wantIDs(t, "claim with the group blocked", got, others...)
		e.sent("p", e.at(time.Minute), got...)
		wantIDs(t, "claim an hour later", e.claim("p", 10, e.at(time.Hour)))

		// Operators find the blocked groups; prune keeps the blocking
		// dead letter.
		page, err := e.s.MessageList(e.ctx, outbox.MessageListParams{BlocksGroup: true})
		if err != nil {
			t.Fatalf("MessageList(BlocksGroup): %v", err)
		}
		wantIDs(t, "MessageList(BlocksGroup)", page.Messages, ms[0])
		if a, ok := e.s.(outbox.Admin); ok && !h.lacks(CapAdmin) {
			found, err := a.MessageSearch(e.ctx, outbox.MessageSearchParams{Filter: outbox.MessageFilter{BlocksGroup: true, Topic: "t"}})
			if err != nil {
				t.Fatalf("MessageSearch(BlocksGroup): %v", err)
			}
			wantIDs(t, "MessageSearch(BlocksGroup)", found.Messages, ms[0])
		}
		if _, err := e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: e.at(1000 * time.Hour)}); err != nil {
			t.Fatalf("MessagePrune: %v", err)
		}
		e.wantStatus("", ms[0].ID, outbox.StatusFailed)

		// Requeue: the dead letter comes first, then its successors.
		rq, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{ID: ms[0].ID, Now: e.at(2 * time.Hour)})
		if err != nil {
			t.Fatalf("MessageRequeue: %v", err)
		}
		if rq.Status != outbox.StatusPending || rq.BlocksGroup {
			t.Fatalf("requeued: status %s BlocksGroup %v, want PENDING false", rq.Status, rq.BlocksGroup)
		}
		wantIDs(t, "claim after the requeue", e.claim("p", 10, e.at(2*time.Hour)), ms...)
		page, err = e.s.MessageList(e.ctx, outbox.MessageListParams{BlocksGroup: true})
		if err != nil || len(page.Messages) != 0 {
			t.Fatalf("MessageList(BlocksGroup) after the requeue: %v, %v; want none", ids(page.Messages), err)
		}
	})

	t.Run("CancelReleasesGroup", func(t *testing.T) {
		need(t, h, CapDeadLetterBlock, CapCancel)
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 3)
		c := e.claim("p", 3, e.t0)
		e.outcomes("p", e.t0, e.dead(c[0], true), e.released(c[1]), e.released(c[2]))
		wantIDs(t, "claim with the group blocked", e.claim("p", 10, e.t0))
		cm, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{ID: ms[0].ID, Now: e.at(time.Second)})
		if err != nil {
			t.Fatalf("MessageCancel of a blocking dead letter: %v", err)
		}
		if cm.Status != outbox.StatusCancelled || cm.BlocksGroup {
			t.Fatalf("cancelled: status %s BlocksGroup %v, want CANCELLED false", cm.Status, cm.BlocksGroup)
		}
		wantIDs(t, "claim after the cancel", e.claim("p", 10, e.at(time.Second)), ms[1], ms[2])
		// A cancelled message stays cancelled.
		_, err = e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{ID: ms[0].ID, Now: e.at(time.Second)})
		wantErrIs(t, "MessageRequeue of a cancelled message", err, outbox.ErrInvalidTransition)
	})

	t.Run("ContinueAndUnorderedDoNotBlock", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 2)
		u := e.enqueueN("t", "", 2)
		c := e.claim("p", 10, e.t0)
		wantIDs(t, "claim", c, append(ms, u...)...)
		block := !h.lacks(CapDeadLetterBlock)
		// Continue in group g; BlockGroup on an unordered message has no
		// group to hold.
		e.outcomes("p", e.t0, e.dead(c[0], false), e.released(c[1]), e.dead(c[2], block), e.released(c[3]))
		for _, id := range []string{ms[0].ID, u[0].ID} {
			if got := e.wantStatus("", id, outbox.StatusFailed); got.BlocksGroup {
				t.Fatalf("dead letter %s: BlocksGroup true, want false", id)
			}
		}
		wantIDs(t, "claim after the dead letters", e.claim("p", 10, e.t0), ms[1], u[1])
	})

	t.Run("RecoveryAppliesTheRule", func(t *testing.T) {
		need(t, h, CapDeadLetterBlock)
		e := setup(t, h)
		rule := outbox.DeadLetterRule{Default: outbox.DeadLetterBlock, ByTopic: map[string]outbox.DeadLetterPolicy{"u": outbox.DeadLetterContinue}}
		recoverAt := func(now time.Time) outbox.RecoverResult {
			res, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{
				ClaimedBefore: now, Now: now, MaxRecoveries: 2, DeadLetter: rule,
			})
			if err != nil {
				t.Fatalf("MessageRecover: %v", err)
			}
			return res
		}
		// The first message of each pair has lost a lease once already (a
		// message that crashes its processors): the next recovery, its
		// second of MaxRecoveries 2, dead-letters it.
		poison := e.enqueue(msg("t", "g", 1), msg("u", "g", 3), msg("t", "", 5))
		e.claim("crashed", 10, e.t0)
		if res := recoverAt(e.at(time.Minute)); res.Recovered != 3 {
			t.Fatalf("first MessageRecover: %+v, want 3 recovered", res)
		}
		rest := e.enqueue(msg("t", "g", 2), msg("u", "g", 4), msg("t", "", 6))
		ms := []outbox.Message{
			poison[0], rest[0], // t blocks: 2 is held
			poison[1], rest[1], // u continues: 4 goes on
			poison[2], rest[2], // unordered: never held
		}
		wantIDs(t, "claim", e.claim("dead-processor", 10, e.at(time.Minute)), append(poison, rest...)...)
		if res := recoverAt(e.at(2 * time.Minute)); res.DeadLettered != 3 || res.Recovered != 3 {
			t.Fatalf("MessageRecover: %+v, want 3 dead-lettered and 3 recovered", res)
		}
		for i, want := range []bool{true, false, false, false, false, false} {
			if got := e.get("", ms[i].ID); got.BlocksGroup != want {
				t.Fatalf("message %d after recovery: %s BlocksGroup %v, want %v", i+1, got.Status, got.BlocksGroup, want)
			}
		}
		wantIDs(t, "claim after recovery", e.claim("p", 10, e.at(2*time.Minute)), ms[3], ms[5])
	})
}

// outcome adds one outcome to a MessageFinish call.
type outcome func(p *outbox.MessageFinishParams)

// outcomes records outs of owner at now in one MessageFinish call and fails
// on a lost lease.
func (e *env[TTx]) outcomes(owner string, now time.Time, outs ...outcome) {
	e.t.Helper()
	p := outbox.MessageFinishParams{Owner: owner, Now: now}
	for _, o := range outs {
		o(&p)
	}
	if res := e.finish(p); len(res.LeaseLost) > 0 {
		e.t.Fatalf("MessageFinish: unexpected LeaseLost %v", res.LeaseLost)
	}
}

// dead is a permanent failure of m, holding its group when block.
func (e *env[TTx]) dead(m outbox.Message, block bool) outcome {
	return func(p *outbox.MessageFinishParams) {
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeDead, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken,
			Error: &outbox.ErrorInfo{Code: "131026", Message: "undeliverable"}, StartedAt: p.Now, BlockGroup: block})
	}
}

// released puts m back unattempted.
func (e *env[TTx]) released(m outbox.Message) outcome {
	return func(p *outbox.MessageFinishParams) {
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
	}
}
