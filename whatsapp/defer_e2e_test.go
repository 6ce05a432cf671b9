package whatsapp

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestDeferredNeverDeadLettered drives the processor, the publisher and a
// real store through many more deferrals than MaxAttempts — the tenant's
// quota used up, the tenant throttled, Meta's rate limits (130429, the pair
// limit 131056, HTTP 429, 80007) — and checks that none counts as an
// attempt: the message is never dead-lettered for them and is sent once the
// quota and throttles free up.
func TestDeferredNeverDeadLettered(t *testing.T) {
	t.Parallel()
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock(time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC))
			testDeferredNeverDeadLettered(t, be.new(t, clock), clock)
		})
	}
}

func testDeferredNeverDeadLettered(t *testing.T, b e2eBackend, clock *fakeClock) {
	ctx := context.Background()
	const maxAttempts = 2
	api := newFakeAPI(t)
	state := NewMemoryState(QuotaOptions{DefaultLimit: 1, Window: time.Hour})
	obs := &recObserver{}
	pub, err := NewPublisher(Config{Credentials: testCreds(), BaseURL: api.srv.URL, Clock: clock, Quotas: state, Throughput: -1})
	if err != nil {
		t.Fatal(err)
	}
	p, err := outbox.NewProcessor(b.store, pub, outbox.Config{PollInterval: 20 * time.Millisecond, Clock: clock, Observer: obs, Topics: []string{"whatsapp"}, MaxAttempts: maxAttempts})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	// Other traffic has used this hour's quota (1 message) when the
	// message is enqueued.
	t0 := clock.Now()
	if _, ok, err := state.QuotaConsume(ctx, "org-1", t0); err != nil || !ok {
		t.Fatal("consuming the quota:", ok, err)
	}
	b.enqueue(t, true, outbox.Message{Tenant: "org-1", Topic: "whatsapp", Group: "16505551234", IdempotencyKey: "first", Payload: json.RawMessage(templatePayload)})
	msgs := listAll(t, b.store, "org-1")
	if len(msgs) != 1 {
		t.Fatalf("%d messages enqueued", len(msgs))
	}
	first := msgs[0]
	metaError := func(status, code int, retryAfter string) func(time.Time) {
		return func(time.Time) {
			api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, _ int) {
				if retryAfter != "" {
					w.Header().Set("Retry-After", retryAfter)
				}
				if code == 0 {
					w.WriteHeader(status)
					return
				}
				writeMetaError(w, status, code, "rate limited")
			})
		}
	}
	usedUp := func(due time.Time) { // other traffic uses the new hour's quota first
		if _, ok, err := state.QuotaConsume(ctx, "org-1", due); err != nil || !ok {
			t.Fatal("consuming the quota:", ok, err)
		}
	}
	rounds := []struct {
		name  string
		setup func(due time.Time) // before the clock reaches due
		code  string
		delay time.Duration
	}{
		{"quota used up at enqueue", nil, CodeQuotaExceeded, time.Hour},
		{"quota used up again", usedUp, CodeQuotaExceeded, time.Hour},
		{"quota used up a third time", usedUp, CodeQuotaExceeded, time.Hour},
		{"quota used up a fourth time", usedUp, CodeQuotaExceeded, time.Hour},
		{"tenant throttled", func(due time.Time) { _ = state.QuotaThrottle(ctx, "org-1", due.Add(10*time.Minute), due) }, CodeThrottled, 10 * time.Minute},
		{"tenant throttled again", func(due time.Time) { _ = state.QuotaThrottle(ctx, "org-1", due.Add(time.Hour), due) }, CodeThrottled, time.Hour},
		{"Meta 130429", func(due time.Time) {
			if err := state.QuotaSetLimit(ctx, "org-1", 1000); err != nil {
				t.Fatal(err)
			}
			metaError(429, 130429, "")(due)
		}, "130429", 5 * time.Second},
		{"Meta pair limit", metaError(400, 131056, ""), "131056", time.Second},
		{"Meta pair limit again", metaError(400, 131056, ""), "131056", 4 * time.Second},
		{"HTTP 429 with Retry-After", metaError(429, 0, "30"), "http_429", 30 * time.Second},
		{"Meta 80007", metaError(400, 80007, ""), "80007", 5 * time.Minute},
	}
	if len(rounds) <= 3*maxAttempts {
		t.Fatal("the test must defer many more times than MaxAttempts")
	}
	due := t0
	for i, r := range rounds {
		if r.setup != nil {
			r.setup(due)
		}
		clock.Advance(due.Sub(clock.Now()))
		p.Wake()
		want := due.Add(r.delay)
		var m outbox.Message
		deadline := time.Now().Add(10 * time.Second)
		for {
			m = get(t, b.store, "org-1", first.ID)
			if m.Status == outbox.StatusFailed || m.Status == outbox.StatusSent {
				t.Fatalf("deferral %d (%s): the message is %s (%+v)", i+1, r.name, m.Status, m.LastError)
			}
			if m.Status == outbox.StatusPending && m.NextAttemptAt.Equal(want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("deferral %d (%s): the message is %s, %d attempts, due at +%v, last error %+v; want PENDING due at +%v",
					i+1, r.name, m.Status, m.Attempts, m.NextAttemptAt.Sub(t0), m.LastError, want.Sub(t0))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if m.Attempts != 0 || m.LastError == nil || m.LastError.Code != r.code {
			t.Fatalf("after deferral %d (%s): attempts %d, last error %+v; want 0 attempts and code %s", i+1, r.name, m.Attempts, m.LastError, r.code)
		}
		due = want
	}
	calls := len(api.requests())
	if calls != 5 {
		t.Fatalf("%d API calls during the deferrals, want 5 (quota and throttles defer before any call)", calls)
	}

	// The quota and the throttles free up: the message is sent, on its
	// first counted attempt.
	api.setHandler(nil)
	clock.Advance(due.Sub(clock.Now()))
	p.Wake()
	waitFor(t, "the message sent", 10*time.Second, func() bool {
		return get(t, b.store, "org-1", first.ID).Status == outbox.StatusSent
	})
	m := get(t, b.store, "org-1", first.ID)
	if m.Attempts != 1 || !strings.HasPrefix(m.ProviderMessageID, "wamid.TEST") {
		t.Fatalf("sent after %d attempts with wamid %q; want 1 attempt", m.Attempts, m.ProviderMessageID)
	}
	if reqs := api.requests(); len(reqs) != calls+1 || reqs[calls].Body["biz_opaque_callback_data"] != first.ID {
		t.Fatalf("%d requests after the deferrals, want the message's one send", len(reqs)-calls)
	}
	atts, err := b.store.AttemptList(ctx, outbox.AttemptListParams{Tenant: "org-1", MessageID: first.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range atts {
		if a.Outcome == outbox.AttemptFailed {
			t.Fatalf("attempt history has a failure: %+v", atts)
		}
	}
	if len(atts) == 0 || atts[len(atts)-1].Outcome != outbox.AttemptSucceeded {
		t.Fatalf("attempt history = %+v, want it to end with the successful send", atts)
	}
	if _, _, _, failed := obs.snapshot(); len(failed) != 0 {
		t.Fatalf("%d OnFailed events", len(failed))
	}
}
