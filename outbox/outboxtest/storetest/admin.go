package storetest

import (
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

// adminEnv is an env whose store implements outbox.Admin.
type adminEnv[TTx any] struct {
	*env[TTx]
	a outbox.Admin
}

func setupAdmin[TTx any](t *testing.T, h Harness[TTx]) *adminEnv[TTx] {
	t.Helper()
	need(t, h, CapAdmin, CapTenants)
	e := setup(t, h)
	a, ok := e.s.(outbox.Admin)
	if !ok {
		t.Fatalf("the Store does not implement outbox.Admin; declare Features.Lacks %q", CapAdmin)
	}
	return &adminEnv[TTx]{env: e, a: a}
}

// enqueueAt enqueues msgs stamped at time at.
func (e *adminEnv[TTx]) enqueueAt(at time.Time, msgs ...outbox.Message) []outbox.Message {
	e.t.Helper()
	res, err := outbox.New[TTx](e.b.Enqueuer, outbox.Options{Clock: fixedClock{at}}).Enqueue(e.ctx, msgs...)
	require.NoError(e.t, err, "Enqueue")
	out := make([]outbox.Message, len(res))
	for i := range res {
		out[i] = res[i].Message
	}
	return out
}

// deadLetter claims every due message and dead-letters those in ms with
// code; the others claimed are released.
func (e *adminEnv[TTx]) deadLetter(code string, ms ...outbox.Message) {
	e.t.Helper()
	e.settle(code, nil, ms)
}

// settle claims every due message, records sent for those in sent and a
// dead letter with code for those in dead, and releases the others.
func (e *adminEnv[TTx]) settle(code string, sent, dead []outbox.Message) {
	e.t.Helper()
	want := map[string]bool{}
	isSent := map[string]bool{}
	for _, m := range dead {
		want[m.ID] = true
	}
	for _, m := range sent {
		want[m.ID] = true
		isSent[m.ID] = true
	}
	got := e.claim("admin-owner", 1000, e.at(time.Hour))
	p := outbox.MessageFinishParams{Owner: "admin-owner", Now: e.at(time.Hour)}
	for _, m := range got {
		if isSent[m.ID] {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "prov-" + m.ID, StartedAt: e.at(time.Hour)})
			delete(want, m.ID)
		} else if want[m.ID] {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, Error: &outbox.ErrorInfo{Code: code, Message: "boom"}, StartedAt: e.at(time.Hour)})
			delete(want, m.ID)
		} else {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
	}
	if len(want) > 0 {
		e.t.Fatalf("deadLetter: %d messages were not claimable", len(want))
	}
	if res := e.finish(p); len(res.LeaseLost) > 0 {
		e.t.Fatalf("MessageFinish: LeaseLost %v", res.LeaseLost)
	}
}

func (e *adminEnv[TTx]) search(f outbox.MessageFilter) []outbox.Message {
	e.t.Helper()
	var all []outbox.Message
	p := outbox.MessageSearchParams{Filter: f, Limit: 2}
	for range 100 {
		page, err := e.a.MessageSearch(e.ctx, p)
		require.NoError(e.t, err, "MessageSearch(%+v)", f)
		all = append(all, page.Messages...)
		if page.NextAfterSeq == 0 {
			return all
		}
		p.AfterSeq = page.NextAfterSeq
	}
	e.t.Fatal("MessageSearch: more than 100 pages")
	return nil
}

func withTenant(m outbox.Message, tenant string) outbox.Message {
	m.Tenant = tenant
	return m
}

func testAdmin[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("SearchFilters", func(t *testing.T) {
		e := setupAdmin(t, h)
		a1 := e.enqueueAt(e.at(0), withTenant(msg("orders", "g1", 1), "A"), withTenant(msg("orders", "g2", 2), "A"))
		b1 := e.enqueueAt(e.at(time.Minute), withTenant(msg("orders", "g1", 3), "B"), withTenant(msg("sms", "", 4), "B"))
		c1 := e.enqueueAt(e.at(2*time.Minute), msg("sms", "g1", 5))
		e.deadLetter("http_400", a1[1])
		e.deadLetter("quota", b1[1])
		all := append(append(append([]outbox.Message{}, a1...), b1...), c1...)
		cases := []struct {
			name string
			f    outbox.MessageFilter
			want []outbox.Message
		}{
			{"all", outbox.MessageFilter{}, all},
			{"tenants", outbox.MessageFilter{Tenants: []string{"A", ""}}, []outbox.Message{a1[0], a1[1], c1[0]}},
			{"status", outbox.MessageFilter{Status: outbox.StatusFailed}, []outbox.Message{a1[1], b1[1]}},
			{"topic", outbox.MessageFilter{Topic: "sms"}, []outbox.Message{b1[1], c1[0]}},
			{"group", outbox.MessageFilter{Group: "g1"}, []outbox.Message{a1[0], b1[0], c1[0]}},
			{"error code", outbox.MessageFilter{ErrorCode: "quota"}, []outbox.Message{b1[1]}},
			{"created range", outbox.MessageFilter{CreatedAfter: e.at(time.Minute), CreatedBefore: e.at(2 * time.Minute)}, b1},
			{"combined", outbox.MessageFilter{Topic: "orders", Group: "g1", Tenants: []string{"B"}}, []outbox.Message{b1[0]}},
		}
		for _, c := range cases {
			wantIDs(t, "MessageSearch "+c.name, e.search(c.f), c.want...)
		}
		_, err := e.a.MessageSearch(e.ctx, outbox.MessageSearchParams{Filter: outbox.MessageFilter{Status: "LOST"}})
		wantErrIs(t, "MessageSearch with an unknown status", err, outbox.ErrInvalidInput)
		_, err = e.a.MessageSearch(e.ctx, outbox.MessageSearchParams{Limit: 5000})
		wantErrIs(t, "MessageSearch with Limit 5000", err, outbox.ErrInvalidInput)
	})

	t.Run("TopicStats", func(t *testing.T) {
		e := setupAdmin(t, h)
		first := e.enqueueAt(e.at(0), withTenant(msg("orders", "g", 1), "A"))
		old := e.enqueueAt(e.at(time.Minute), withTenant(msg("orders", "", 2), "B"), msg("orders", "", 3))
		e.enqueueAt(e.at(2*time.Minute), msg("sms", "", 4))
		e.settle("x", first, old[1:])
		stats, err := e.a.TopicStats(e.ctx, outbox.TopicStatsParams{})
		require.NoError(t, err, "TopicStats")
		if len(stats) != 2 || stats[0].Topic != "orders" || stats[1].Topic != "sms" {
			t.Fatalf("TopicStats = %+v, want orders and sms", stats)
		}
		wantCounts(t, stats[0].Counts, map[outbox.Status]int64{outbox.StatusSent: 1, outbox.StatusPending: 1, outbox.StatusFailed: 1})
		wantTime(t, "orders' oldest pending", stats[0].OldestPendingAt, e.at(time.Minute))
		wantCounts(t, stats[1].Counts, map[outbox.Status]int64{outbox.StatusPending: 1})
		wantTime(t, "sms' oldest pending", stats[1].OldestPendingAt, e.at(2*time.Minute))
		if got := stats[1].OldestPendingAge(e.at(3 * time.Minute)); got != time.Minute {
			t.Errorf("OldestPendingAge = %v, want 1m", got)
		}
		stats, err = e.a.TopicStats(e.ctx, outbox.TopicStatsParams{Tenants: []string{"A"}})
		require.NoError(t, err, "TopicStats(A)")
		if len(stats) != 1 || !stats[0].OldestPendingAt.IsZero() || stats[0].Counts[outbox.StatusSent] != 1 {
			t.Errorf("TopicStats(A) = %+v, want orders with 1 SENT and no pending", stats)
		}
	})

	t.Run("RequeueMany", func(t *testing.T) {
		e := setupAdmin(t, h)
		var dead []outbox.Message
		for i := range 5 {
			dead = append(dead, e.enqueueAt(e.at(0), msg("orders", "", i))...)
		}
		other := e.enqueueAt(e.at(0), msg("sms", "", 9))
		pending := e.enqueueAt(e.at(0), msg("orders", "", 10))
		e.deadLetter("http_400", dead...)
		e.deadLetter("http_500", other...)
		before := e.search(outbox.MessageFilter{})

		// Refused: nothing changes.
		_, err := e.a.MessageRequeueMany(e.ctx, outbox.MessageRequeueManyParams{})
		wantErrIs(t, "MessageRequeueMany with an empty filter and no All", err, outbox.ErrInvalidInput)
		_, err = e.a.MessageRequeueMany(e.ctx, outbox.MessageRequeueManyParams{Filter: outbox.MessageFilter{Status: outbox.StatusPending}})
		wantErrIs(t, "MessageRequeueMany of PENDING messages", err, outbox.ErrInvalidInput)
		// Dry run: counts, changes nothing.
		dry, err := outbox.RequeueAll(e.ctx, e.a, outbox.MessageRequeueManyParams{Filter: outbox.MessageFilter{ErrorCode: "http_400"}, DryRun: true, Limit: 2}, nil)
		if err != nil || dry.Matched != 5 || dry.Requeued != 0 {
			t.Fatalf("dry run = %+v, %v; want 5 matched, 0 requeued", dry, err)
		}
		after := e.search(outbox.MessageFilter{})
		for i := range before {
			if after[i].Status != before[i].Status || !after[i].UpdatedAt.Equal(before[i].UpdatedAt) {
				t.Fatalf("a refused call or a dry run changed message %s", before[i].ID)
			}
		}
		// In chunks of 2: 3 calls.
		chunks := 0
		res, err := outbox.RequeueAll(e.ctx, e.a, outbox.MessageRequeueManyParams{
			Filter: outbox.MessageFilter{Topic: "orders"}, Limit: 2, Now: e.at(2 * time.Hour),
		}, func(r outbox.RequeueManyResult) { chunks++ })
		if err != nil || res.Requeued != 5 || res.Matched != 5 || chunks != 3 {
			t.Fatalf("RequeueAll = %+v, %v in %d chunks; want 5 requeued in 3", res, err, chunks)
		}
		sort.Strings(res.IDs)
		want := ids(dead)
		sort.Strings(want)
		if len(res.IDs) != 5 || res.IDs[0] != want[0] || res.IDs[4] != want[4] {
			t.Errorf("requeued IDs = %v, want %v", res.IDs, want)
		}
		for _, m := range dead {
			got := e.wantStatus("", m.ID, outbox.StatusPending)
			if got.Attempts != 0 || got.NextAttemptAt.After(e.at(2*time.Hour)) {
				t.Errorf("requeued %s: attempts %d, due %v; want 0, due by %v", m.ID, got.Attempts, got.NextAttemptAt, e.at(2*time.Hour))
			}
		}
		e.wantStatus("", other[0].ID, outbox.StatusFailed)
		e.wantStatus("", pending[0].ID, outbox.StatusPending)
		// All: the rest.
		res, err = e.a.MessageRequeueMany(e.ctx, outbox.MessageRequeueManyParams{All: true, Now: e.at(2 * time.Hour)})
		if err != nil || res.Requeued != 1 || res.NextAfterSeq != 0 {
			t.Fatalf("MessageRequeueMany(All) = %+v, %v; want 1 requeued, last chunk", res, err)
		}
		e.wantStatus("", other[0].ID, outbox.StatusPending)
	})

	// A message the provider failed after it was sent, requeued one by one
	// or in bulk, starts over: no provider ID (a late receipt for the old
	// one must not find it) and no sent time.
	t.Run("RequeueForgetsDelivery", func(t *testing.T) {
		need(t, h, CapReceipts)
		e := setupAdmin(t, h)
		one, many := e.sentMessage("", "wamid.r1"), e.sentMessage("", "wamid.r2")
		for _, pid := range []string{"wamid.r1", "wamid.r2"} {
			if res := e.receipt(outbox.Receipt{ProviderMessageID: pid, Status: outbox.DeliveryFailed, At: e.at(time.Minute),
				Error: &outbox.ErrorInfo{Code: "131026", Message: "undeliverable"}}); !res.Changed {
				t.Fatalf("failed receipt for %s changed nothing", pid)
			}
		}
		if _, err := e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{ID: one.ID, Now: e.at(time.Hour)}); err != nil {
			t.Fatalf("MessageRequeue: %v", err)
		}
		res, err := e.a.MessageRequeueMany(e.ctx, outbox.MessageRequeueManyParams{Filter: outbox.MessageFilter{ErrorCode: "131026"}, Now: e.at(time.Hour)})
		if err != nil || res.Requeued != 1 {
			t.Fatalf("MessageRequeueMany = %+v, %v; want 1 requeued", res, err)
		}
		for _, m := range []outbox.Message{one, many} {
			got := e.wantStatus("", m.ID, outbox.StatusPending)
			if got.ProviderMessageID != "" || !got.SentAt.IsZero() || !got.DeliveredAt.IsZero() || !got.ReadAt.IsZero() {
				t.Errorf("requeued %s keeps its delivery: provider ID %q, sent %v, delivered %v, read %v",
					m.ID, got.ProviderMessageID, got.SentAt, got.DeliveredAt, got.ReadAt)
			}
		}
		_, err = e.s.MessageApplyReceipt(e.ctx, outbox.MessageApplyReceiptParams{Receipt: outbox.Receipt{
			ProviderMessageID: "wamid.r2", Status: outbox.DeliveryDelivered, At: e.at(2 * time.Hour)}})
		wantErrIs(t, "a receipt for the provider ID a requeued message had", err, outbox.ErrNotFound)
	})

	t.Run("Pause", func(t *testing.T) {
		e := setupAdmin(t, h)
		wantErrIs(t, "PauseAdd without a topic", e.a.PauseAdd(e.ctx, outbox.PauseAddParams{}), outbox.ErrInvalidInput)
		o1 := e.enqueueAt(e.at(0), msg("orders", "g1", 1), msg("orders", "", 2))
		o2 := e.enqueueAt(e.at(0), withTenant(msg("orders", "g1", 3), "B"), withTenant(msg("orders", "g2", 4), "B"))
		s1 := e.enqueueAt(e.at(0), msg("sms", "g1", 5))
		for _, p := range []outbox.PauseAddParams{
			{Topic: "orders", Now: e.at(0)},
			{Topic: "orders", Now: e.at(0)}, // again: no error
			{Topic: "sms", Group: "g1", Tenant: "B", Now: e.at(0)},
		} {
			require.NoError(t, e.a.PauseAdd(e.ctx, p), "PauseAdd(%+v)", p)
		}
		pauses, err := e.a.PauseList(e.ctx, outbox.PauseListParams{})
		if err != nil || len(pauses) != 2 || pauses[0].Topic != "orders" || pauses[0].Group != "" || pauses[1].Topic != "sms" || pauses[1].Tenant != "B" {
			t.Fatalf("PauseList = %+v, %v; want orders and sms/g1 of B", pauses, err)
		}
		// orders is paused in every tenant, ordered and unordered; sms/g1
		// of B is paused, the sms/g1 of tenant "" is not.
		got := e.claim("o", 100, e.at(time.Minute))
		wantIDs(t, "claim while orders is paused", got, s1...)
		e.sent("o", e.at(time.Minute), got...)

		// Pause one group of one tenant instead.
		if ok, err := e.a.PauseRemove(e.ctx, outbox.PauseRemoveParams{Topic: "orders"}); err != nil || !ok {
			t.Fatalf("PauseRemove(orders) = %v, %v; want true", ok, err)
		}
		if ok, err := e.a.PauseRemove(e.ctx, outbox.PauseRemoveParams{Topic: "orders"}); err != nil || ok {
			t.Fatalf("PauseRemove(orders) again = %v, %v; want false", ok, err)
		}
		require.NoError(t, e.a.PauseAdd(e.ctx, outbox.PauseAddParams{Topic: "orders", Group: "g1", Tenant: "B", Now: e.at(0)}))
		wantIDs(t, "claim while orders/g1 of B is paused", e.claim("o", 100, e.at(time.Minute)), o1[0], o1[1], o2[1])
		if ok, err := e.a.PauseRemove(e.ctx, outbox.PauseRemoveParams{Topic: "orders", Group: "g1", Tenant: "B"}); err != nil || !ok {
			t.Fatalf("PauseRemove(orders/g1/B) = %v, %v; want true", ok, err)
		}
		wantIDs(t, "claim after resume", e.claim("o", 100, e.at(time.Minute)), o2[0])
	})
}
