package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

func (e *env[TTx]) list(p outbox.MessageListParams) outbox.MessagePage {
	e.t.Helper()
	page, err := e.s.MessageList(e.ctx, p)
	require.NoError(e.t, err, "MessageList(%+v)", p)
	return page
}

// listAll pages through a listing with page size limit.
func (e *env[TTx]) listAll(p outbox.MessageListParams) (all []outbox.Message, pages int) {
	e.t.Helper()
	for {
		page := e.list(p)
		pages++
		if len(page.Messages) > p.Limit && p.Limit > 0 {
			e.t.Fatalf("page of %d messages, limit %d", len(page.Messages), p.Limit)
		}
		all = append(all, page.Messages...)
		if page.NextAfterSeq == 0 {
			return all, pages
		}
		if pages > 1000 {
			e.t.Fatal("MessageList never ends")
		}
		p.AfterSeq = page.NextAfterSeq
	}
}

func testQuery[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("PendingTopics", func(t *testing.T) {
		e := setup(t, h)
		l, ok := e.s.(outbox.PendingTopicLister)
		if !ok {
			t.Skip("the store does not implement outbox.PendingTopicLister")
		}
		other := msg("b", "", 2)
		other.Tenant = "other"
		later := msg("c", "", 3)
		later.NextAttemptAt = e.at(time.Hour)
		e.enqueue(msg("a", "", 0), msg("a", "g", 1), other, later)
		first := e.claim("p", 1, e.t0) // one of topic a is PROCESSING: not pending
		got, err := l.MessagePendingTopics(e.ctx, outbox.MessagePendingTopicsParams{DueBefore: e.at(time.Minute)})
		require.NoError(t, err)
		want := []outbox.PendingTopic{{Topic: "a", Messages: 1, OldestDueAt: e.t0}, {Topic: "b", Messages: 1, OldestDueAt: e.t0}}
		if len(got) != len(want) {
			t.Fatalf("pending topics = %+v, want %+v", got, want)
		}
		for i := range want {
			if got[i].Topic != want[i].Topic || got[i].Messages != want[i].Messages || !got[i].OldestDueAt.Equal(want[i].OldestDueAt) {
				t.Fatalf("pending topics = %+v, want %+v", got, want)
			}
		}
		if got, err := l.MessagePendingTopics(e.ctx, outbox.MessagePendingTopicsParams{DueBefore: e.at(-time.Minute)}); err != nil || len(got) != 0 {
			t.Fatalf("pending topics due a minute before t0 = %+v, %v; want none", got, err)
		}
		// An excluded topic may be left out; the others are counted as
		// before.
		got, err = l.MessagePendingTopics(e.ctx, outbox.MessagePendingTopicsParams{DueBefore: e.at(time.Minute), ExcludeTopics: []string{"a"}})
		require.NoError(t, err)
		if len(got) > 0 && got[0].Topic == "a" {
			if got[0].Messages != want[0].Messages || !got[0].OldestDueAt.Equal(want[0].OldestDueAt) {
				t.Fatalf("pending topics excluding a = %+v, want a (optional) as %+v", got, want[0])
			}
			got = got[1:]
		}
		if len(got) != 1 || got[0].Topic != "b" || got[0].Messages != 1 || !got[0].OldestDueAt.Equal(e.t0) {
			t.Fatalf("pending topics excluding a = %+v, want b (and a, optionally)", got)
		}
		// Sent messages are not pending, whatever the store keeps of them.
		rest := e.claim("p", 10, e.at(time.Second))
		if len(rest) != 2 {
			t.Fatalf("claimed %d of the 2 due messages left, want 2", len(rest))
		}
		e.sent("p", e.at(time.Second), append(first, rest...)...)
		if got, err := l.MessagePendingTopics(e.ctx, outbox.MessagePendingTopicsParams{DueBefore: e.at(time.Minute)}); err != nil || len(got) != 0 {
			t.Fatalf("pending topics once every due message is sent = %+v, %v; want none", got, err)
		}
	})

	t.Run("Pagination", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueueN("t", "g", 25)
		all, pages := e.listAll(outbox.MessageListParams{Limit: 10})
		wantIDs(t, "all pages", all, ms...)
		if pages != 3 {
			t.Fatalf("%d pages of 10 for 25 messages, want 3", pages)
		}
		// An exact multiple of the page size still ends.
		all, _ = e.listAll(outbox.MessageListParams{Limit: 5})
		wantIDs(t, "pages of 5", all, ms...)
		// Default limit.
		if page := e.list(outbox.MessageListParams{}); len(page.Messages) != 25 || page.NextAfterSeq != 0 {
			t.Fatalf("default listing: %d messages, next %d", len(page.Messages), page.NextAfterSeq)
		}
		_, err := e.s.MessageList(e.ctx, outbox.MessageListParams{Status: "QUEUED"})
		wantErrIs(t, "MessageList with an unknown status", err, outbox.ErrInvalidInput)
	})

	t.Run("PaginationWithLeasedMessages", func(t *testing.T) {
		// Leased (PROCESSING) messages between the others: a store may
		// index them apart, and its pages must still hold every message
		// once, in Seq order, with the status filter and the counts right.
		e := setup(t, h)
		msgs := make([]outbox.Message, 25)
		for i := range msgs {
			msgs[i] = msg("t", "", i)
			if i%2 == 1 {
				msgs[i].NextAttemptAt = e.at(time.Hour) // not due: stays PENDING
			}
		}
		ms := e.enqueue(msgs...)
		var leased, pending []outbox.Message
		for i, m := range ms {
			if i%2 == 0 {
				leased = append(leased, m)
			} else {
				pending = append(pending, m)
			}
		}
		// A store may claim fewer than the limit at a time.
		claimed := 0
		for claimed < len(leased) {
			c := e.claim("p", 100, e.t0)
			if len(c) == 0 {
				t.Fatalf("claimed %d messages, want the %d due", claimed, len(leased))
			}
			claimed += len(c)
		}
		for _, limit := range []int{1, 4, 10} {
			all, _ := e.listAll(outbox.MessageListParams{Limit: limit})
			wantIDs(t, fmt.Sprintf("pages of %d", limit), all, ms...)
		}
		all, _ := e.listAll(outbox.MessageListParams{Limit: 3, Status: outbox.StatusProcessing})
		wantIDs(t, "PROCESSING", all, leased...)
		all, _ = e.listAll(outbox.MessageListParams{Limit: 3, Status: outbox.StatusPending})
		wantIDs(t, "PENDING", all, pending...)
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusProcessing: 13, outbox.StatusPending: 12})
	})

	t.Run("Filters", func(t *testing.T) {
		e := setup(t, h)
		ms := e.enqueue(msg("a", "g1", 0), msg("a", "g2", 1), msg("b", "g1", 2), msg("a", "g1", 3))
		e.sent("p", e.t0, e.claim("p", 1, e.t0)...) // ms[0] SENT
		wantIDs(t, "topic a", e.list(outbox.MessageListParams{Topic: "a"}).Messages, ms[0], ms[1], ms[3])
		wantIDs(t, "group g1", e.list(outbox.MessageListParams{Group: "g1"}).Messages, ms[0], ms[2], ms[3])
		wantIDs(t, "topic a group g1 PENDING", e.list(outbox.MessageListParams{Topic: "a", Group: "g1", Status: outbox.StatusPending}).Messages, ms[3])
		wantIDs(t, "SENT", e.list(outbox.MessageListParams{Status: outbox.StatusSent}).Messages, ms[0])
	})

	t.Run("CountsByStatus", func(t *testing.T) {
		need(t, h, CapReceipts, CapCancel)
		e := setup(t, h)
		wantCounts(t, e.count(""), nil)
		ms := e.enqueueN("t", "", 7)
		c := e.claim("p", 5, e.t0) // ms[0..4]
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0,
			Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, ProviderMessageID: "p0"}, {Kind: outbox.OutcomeSent, ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken, ProviderMessageID: "p1"},
				{Kind: outbox.OutcomeDead, ID: c[2].ID, Attempt: 1, ClaimToken: c[2].ClaimToken, Error: &outbox.ErrorInfo{Code: "x"}}},
		})
		e.receipt(outbox.Receipt{ProviderMessageID: "p1", Status: outbox.DeliveryDelivered, At: e.t0})
		if _, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{ID: ms[5].ID, Now: e.t0}); err != nil {
			t.Fatal(err)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{
			outbox.StatusPending: 1, outbox.StatusProcessing: 2, outbox.StatusSent: 1,
			outbox.StatusDelivered: 1, outbox.StatusFailed: 1, outbox.StatusCancelled: 1,
		})
	})

	t.Run("PruneOldFinishedOnly", func(t *testing.T) {
		need(t, h, CapCancel, CapAttemptHistory)
		e := setup(t, h)
		old := e.enqueueN("t", "", 6)
		c := e.claim("p", 4, e.t0) // old[0..3] PROCESSING since t0
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0,
			Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken},
				{Kind: outbox.OutcomeDead, ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken, Error: &outbox.ErrorInfo{Code: "x"}}},
		})
		if _, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{ID: old[4].ID, Now: e.t0}); err != nil {
			t.Fatal(err)
		}
		// old[2], old[3] PROCESSING, old[5] PENDING: old but not finished.
		recent := e.enqueueN("t", "", 1)
		e.sent("p", e.at(time.Hour), e.claim("p", 1, e.at(time.Hour))...)

		_, err := e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{})
		wantErrIs(t, "MessagePrune without Before", err, outbox.ErrInvalidInput)

		n, err := e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: e.at(time.Minute), Limit: 2})
		if err != nil || n != 2 {
			t.Fatalf("MessagePrune with limit 2: %d, %v; want 2", n, err)
		}
		n, err = e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: e.at(time.Minute)})
		if err != nil || n != 1 {
			t.Fatalf("second MessagePrune: %d, %v; want the 1 left", n, err)
		}
		for _, m := range []outbox.Message{old[0], old[1], old[4]} {
			_, err := e.s.MessageGet(e.ctx, outbox.MessageGetParams{ID: m.ID})
			wantErrIs(t, "MessageGet of a pruned message", err, outbox.ErrNotFound)
			as, err := e.s.AttemptList(e.ctx, outbox.AttemptListParams{MessageID: m.ID})
			if len(as) != 0 {
				t.Fatalf("a pruned message kept its attempts: %+v, %v", as, err)
			}
		}
		for _, m := range []outbox.Message{old[2], old[3], old[5], recent[0]} {
			e.get("", m.ID)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusProcessing: 2, outbox.StatusPending: 1, outbox.StatusSent: 1})
	})

	t.Run("PruneByStatusAndTopic", func(t *testing.T) {
		need(t, h, CapCancel, CapAttemptHistory)
		e := setup(t, h)
		a, b := e.enqueueN("a", "", 3), e.enqueueN("b", "", 2)
		c := e.claim("p", 5, e.t0)
		if len(c) != 5 {
			t.Fatalf("claimed %d, want 5", len(c))
		}
		var outs []outbox.Outcome
		for _, m := range c {
			k := outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: 1, ClaimToken: m.ClaimToken}
			if m.ID == a[1].ID || m.ID == b[1].ID {
				k = outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Attempt: 1, ClaimToken: m.ClaimToken, Error: &outbox.ErrorInfo{Code: "x"}}
			}
			if m.ID == a[2].ID {
				k = outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: 1, ClaimToken: m.ClaimToken}
			}
			outs = append(outs, k)
		}
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: outs})
		if _, err := e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{ID: a[2].ID, Now: e.t0}); err != nil {
			t.Fatal(err)
		}
		// a: SENT, FAILED, CANCELLED; b: SENT, FAILED.
		before := e.at(time.Minute)
		_, err := e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: before, Statuses: []outbox.Status{outbox.StatusPending}})
		wantErrIs(t, "MessagePrune of PENDING", err, outbox.ErrInvalidInput)
		keepDead := []outbox.Status{outbox.StatusSent, outbox.StatusDelivered, outbox.StatusCancelled}
		n, err := e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: before, Statuses: keepDead, DryRun: true, Limit: 1})
		if err != nil || n != 3 {
			t.Fatalf("MessagePrune dry run: %d, %v; want 3 counted (Limit aside)", n, err)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: 2, outbox.StatusFailed: 2, outbox.StatusCancelled: 1})
		n, err = e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: before, Statuses: keepDead, Topic: "a"})
		if err != nil || n != 2 {
			t.Fatalf("MessagePrune of topic a without dead letters: %d, %v; want 2", n, err)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: 1, outbox.StatusFailed: 2})
		n, err = e.s.MessagePrune(e.ctx, outbox.MessagePruneParams{Before: before, Statuses: []outbox.Status{outbox.StatusFailed}, Topic: "b"})
		if err != nil || n != 1 {
			t.Fatalf("MessagePrune of b's dead letters: %d, %v; want 1", n, err)
		}
		e.get("", a[1].ID)
		e.get("", b[0].ID)
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: 1, outbox.StatusFailed: 1})
	})

	t.Run("TenantIsolation", func(t *testing.T) {
		need(t, h, CapTenants, CapIdempotency, CapAttemptHistory)
		e := setup(t, h)
		a := e.enqueue(outbox.Message{Tenant: "a", Topic: "t", IdempotencyKey: "k", Payload: []byte(`1`)},
			outbox.Message{Tenant: "a", Topic: "t", Payload: []byte(`2`)})
		b := e.enqueue(outbox.Message{Tenant: "b", Topic: "t", IdempotencyKey: "k", Payload: []byte(`3`)})
		if a[0].ID == b[0].ID {
			t.Fatal("the same key in two tenants gave one message")
		}
		_, err := e.s.MessageGet(e.ctx, outbox.MessageGetParams{Tenant: "b", ID: a[0].ID})
		wantErrIs(t, "MessageGet of another tenant's message", err, outbox.ErrNotFound)
		_, err = e.s.MessageGet(e.ctx, outbox.MessageGetParams{Tenant: "", ID: a[0].ID})
		wantErrIs(t, "MessageGet with the empty tenant", err, outbox.ErrNotFound)
		wantIDs(t, "list a", e.list(outbox.MessageListParams{Tenant: "a"}).Messages, a...)
		wantIDs(t, "list b", e.list(outbox.MessageListParams{Tenant: "b"}).Messages, b...)
		wantIDs(t, "list c", e.list(outbox.MessageListParams{Tenant: "c"}).Messages)
		wantCounts(t, e.count("a"), map[outbox.Status]int64{outbox.StatusPending: 2})
		wantCounts(t, e.count("b"), map[outbox.Status]int64{outbox.StatusPending: 1})
		all, err := e.s.MessageCount(e.ctx, outbox.MessageCountParams{AllTenants: true})
		require.NoError(t, err)
		wantCounts(t, all, map[outbox.Status]int64{outbox.StatusPending: 3})
		// Attempts are tenant-scoped too.
		c := e.claim("p", 3, e.t0)
		e.sent("p", e.t0, c...)
		if as, err := e.s.AttemptList(e.ctx, outbox.AttemptListParams{Tenant: "b", MessageID: a[0].ID}); len(as) != 0 {
			t.Fatalf("AttemptList of another tenant's message: %+v, %v", as, err)
		}
		if as := e.attempts("a", a[0].ID); len(as) != 1 {
			t.Fatalf("AttemptList: %d attempts, want 1", len(as))
		}
		// The zero MessageCountParams counts tenant "" only (the tenant of
		// single-tenant services), never every tenant; AllTenants ignores
		// Tenant.
		wantCounts(t, e.count(""), map[outbox.Status]int64{})
		e.enqueue(outbox.Message{Topic: "t", Payload: []byte(`4`)})
		zero, err := e.s.MessageCount(e.ctx, outbox.MessageCountParams{})
		if err != nil {
			t.Fatal(err)
		}
		wantCounts(t, zero, map[outbox.Status]int64{outbox.StatusPending: 1})
		all, err = e.s.MessageCount(e.ctx, outbox.MessageCountParams{Tenant: "a", AllTenants: true})
		if err != nil {
			t.Fatal(err)
		}
		wantCounts(t, all, map[outbox.Status]int64{outbox.StatusSent: 3, outbox.StatusPending: 1})
	})
}
