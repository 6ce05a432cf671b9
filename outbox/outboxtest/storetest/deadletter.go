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
		one := func(topic, group string, n int) outbox.Message {
			m := msg(topic, group, n)
			m.MaxAttempts = 1
			return m
		}
		ms := e.enqueue(
			one("t", "g", 1), msg("t", "g", 2), // t blocks: 2 is held
			one("u", "g", 3), msg("u", "g", 4), // u continues: 4 goes on
			one("t", "", 5), msg("t", "", 6), // unordered: never held
		)
		wantIDs(t, "claim", e.claim("dead-processor", 10, e.t0), ms...)
		res, err := e.s.MessageRecover(e.ctx, outbox.MessageRecoverParams{
			ClaimedBefore: e.at(time.Minute), Now: e.at(time.Minute), MaxAttempts: 5,
			DeadLetter: outbox.DeadLetterRule{Default: outbox.DeadLetterBlock, ByTopic: map[string]outbox.DeadLetterPolicy{"u": outbox.DeadLetterContinue}},
		})
		if err != nil {
			t.Fatalf("MessageRecover: %v", err)
		}
		if res.DeadLettered != 3 || res.Recovered != 3 {
			t.Fatalf("MessageRecover: %+v, want 3 dead-lettered and 3 recovered", res)
		}
		for i, want := range []bool{true, false, false, false, false, false} {
			if got := e.get("", ms[i].ID); got.BlocksGroup != want {
				t.Fatalf("message %d after recovery: %s BlocksGroup %v, want %v", i+1, got.Status, got.BlocksGroup, want)
			}
		}
		wantIDs(t, "claim after recovery", e.claim("p", 10, e.at(time.Minute)), ms[3], ms[5])
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
		p.Dead = append(p.Dead, outbox.DeadOutcome{Topic: m.Topic, ID: m.ID, Attempt: m.Attempts,
			Error: outbox.ErrorInfo{Code: "131026", Message: "undeliverable"}, StartedAt: p.Now})
	}
}

// released puts m back unattempted.
func (e *env[TTx]) released(m outbox.Message) outcome {
	return func(p *outbox.MessageFinishParams) {
		p.Released = append(p.Released, outbox.ReleaseOutcome{Topic: m.Topic, ID: m.ID, Attempt: m.Attempts})
	}
}
