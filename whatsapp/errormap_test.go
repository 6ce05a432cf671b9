package whatsapp

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestErrorMapReference pins the classification of the codes the reference
// and seed 002 name, independently of the map's own table.
func TestErrorMapReference(t *testing.T) {
	t.Parallel()
	type want struct {
		retry bool
		scope Scope
	}
	perm := want{}
	retry := want{retry: true}
	tenant := want{retry: true, scope: ScopeTenant}
	creds := want{scope: ScopeCredentials}
	expect := map[int]want{
		// rate limits: retried, tenant throttled; pair limit: recipient
		4: tenant, 80007: tenant, 130429: tenant, 131048: tenant, 133016: tenant, 131064: tenant,
		131056: {retry: true, scope: ScopeRecipient},
		// temporary
		1: retry, 2: retry, 131000: retry, 131016: retry, 131057: retry, 133004: retry, 131049: retry, 132069: retry, 133015: retry,
		// window closed, recipient, template, auth and account errors: permanent
		131047: perm, 470: perm, 131026: perm, 131021: perm, 131031: perm, 131050: perm, 130403: perm,
		132000: perm, 132001: perm, 132005: perm, 132007: perm, 132012: perm, 132015: perm, 132016: perm, 132068: perm,
		0: creds, 190: creds, 10: perm, 100: perm, 200: perm, 299: perm, 368: perm, 131005: perm, 131042: perm, 131008: perm, 131009: perm,
		133000: perm, 135000: perm, 131051: perm, 131053: perm,
		// unknown codes are retryable
		123456: retry,
	}
	m := DefaultErrorMap()
	for code, w := range expect {
		s := m.Classify(code, "")
		if s.Retryable != w.retry || s.RateLimit != w.scope {
			t.Errorf("code %d: retryable=%v scope=%v, want %v %v", code, s.Retryable, s.RateLimit, w.retry, w.scope)
		}
	}
	if s := m.Classify(131049, ""); s.RetryAfter != 24*time.Hour {
		t.Errorf("131049 waits %v, Meta says 24 hours", s.RetryAfter)
	}
	if s := m.Classify(777, "Cloud API message throughput has been reached."); s.RateLimit != ScopeTenant {
		t.Errorf("unknown code with a throughput detail: %+v", s)
	}
	seed := []int{0, 1, 2, 3, 4, 5, 100, 130, 131000, 131005, 131008, 131009, 131016, 131021, 131026, 131031, 131042, 131045, 131047,
		131051, 131052, 131053, 132000, 132001, 132005, 132007, 132012, 132015, 132016, 132068, 132069, 133000, 133004, 133005, 133006,
		133008, 133009, 133010, 133015, 133016, 135000, 190, 200, 368, 470, 471, 80007}
	for _, c := range seed {
		if _, ok := m.Lookup(c); !ok && c != 130 {
			t.Errorf("seed code %d missing from the map", c)
		}
	}
	for _, c := range m.Codes() {
		if s, _ := m.Lookup(c); s.Description == "" {
			t.Errorf("code %d has no description", c)
		}
	}
}

func TestErrorMapOverride(t *testing.T) {
	t.Parallel()
	m := DefaultErrorMap()
	m.Set(ErrorSpec{Code: 190, Description: "token expired: refreshed by the host", Retryable: true, RetryAfter: time.Minute})
	if s := m.Classify(190, ""); !s.Retryable || s.RetryAfter != time.Minute {
		t.Fatalf("override ignored: %+v", s)
	}
	if s := DefaultErrorMap().Classify(190, ""); s.Retryable {
		t.Fatal("an override leaked into a new default map")
	}
	var empty ErrorMap
	empty.Set(ErrorSpec{Code: 1})
	if _, ok := empty.Lookup(1); !ok {
		t.Fatal("zero ErrorMap is not usable")
	}
}

// TestEveryMappedCodeThroughTheAPI answers each code of the map from the
// fake Cloud API and checks the publisher's decision: retry or not, and
// whether the tenant (or only the recipient) is throttled.
func TestEveryMappedCodeThroughTheAPI(t *testing.T) {
	t.Parallel()
	m := DefaultErrorMap()
	for _, code := range m.Codes() {
		spec, _ := m.Lookup(code)
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			api := newFakeAPI(t)
			api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, _ int) {
				writeMetaError(w, 400, code, "details for "+strconv.Itoa(code))
			})
			clock := newFakeClock(time.Now())
			state := NewMemoryState(QuotaOptions{})
			p := newTestPublisher(t, api, func(c *Config) { c.Quotas, c.Clock = state, clock })
			ctx := context.Background()
			res := p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload)})[0]
			if spec.RateLimit != ScopeNone {
				// a rate limit defers the message: retried after the
				// throttle, no attempt counted, never dead-lettered for it
				de := deferErr(t, res)
				want, wantCode := spec.RetryAfter, strconv.Itoa(code)
				switch spec.RateLimit {
				case ScopeRecipient:
					want = time.Second // Meta's 4^0 s after a first pair-limit error
				case ScopeCredentials:
					// the tenant pauses until its credentials change
					want, wantCode = time.Minute, CodeCredentialsRejected
				}
				if de.Code != wantCode || de.Delay != want {
					t.Fatalf("deferred %q for %v, want %s for %v", de.Code, de.Delay, wantCode, want)
				}
			} else {
				pe := publishErr(t, res)
				if pe.Code != strconv.Itoa(code) {
					t.Fatalf("Code = %q", pe.Code)
				}
				if outbox.IsRetryable(res.Err) != spec.Retryable {
					t.Fatalf("retryable = %v, want %v", outbox.IsRetryable(res.Err), spec.Retryable)
				}
				if spec.RetryAfter > 0 && pe.RetryAfter != spec.RetryAfter {
					t.Fatalf("RetryAfter = %v, want %v", pe.RetryAfter, spec.RetryAfter)
				}
			}
			st, _ := state.QuotaGet(ctx, "org-1", clock.Now())
			if st.Throttled != (spec.RateLimit == ScopeTenant) {
				t.Fatalf("tenant throttled = %v for scope %v", st.Throttled, spec.RateLimit)
			}
			// the next message: throttled (tenant or pair) without a call, or sent
			n := len(api.requests())
			res2 := p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload)})[0]
			throttledNow := len(api.requests()) == n
			if throttledNow != (spec.RateLimit != ScopeNone) {
				t.Fatalf("next message throttled = %v for scope %v (%v)", throttledNow, spec.RateLimit, res2.Err)
			}
		})
	}
}

// A deployment overrides a code's class: the publisher follows it, the
// default map is untouched, and a bad override is refused.
func TestErrorClassesOverride(t *testing.T) {
	t.Parallel()
	classes, err := ParseErrorClasses("131026=retryable, 133004=permanent 130429=permanent,999=retryable")
	if err != nil {
		t.Fatal(err)
	}
	m, err := DefaultErrorMap().WithClasses(classes)
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]string{131026: "retryable", 133004: "permanent", 130429: "permanent", 999: "retryable", 131047: "permanent", 131000: "retryable"} {
		if got := m.Classify(code, "").Class(); got != want {
			t.Errorf("code %d with overrides: %s, want %s", code, got, want)
		}
	}
	if DefaultErrorMap().Classify(131026, "").Class() != "permanent" || DefaultErrorMap().Classify(133004, "").Class() != "retryable" {
		t.Error("the default map changed")
	}
	for _, bad := range []string{"131026", "x=retryable", "131026=maybe", "1=retryable,1=permanent", "-4=permanent"} {
		if _, err := ParseErrorClasses(bad); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("%q: %v, want an invalid-input error", bad, err)
		}
	}
	if _, err := NewPublisher(Config{Credentials: testCreds(), ErrorClasses: map[int]ErrorClass{1: "sometimes"}}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("NewPublisher with an unknown class: %v", err)
	}

	// The publisher: 131026 retried (attempt counted), not dead-lettered.
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, r *http.Request, body map[string]any, n int) {
		writeMetaError(w, 400, 131026, "Message undeliverable")
	})
	p := newTestPublisher(t, api, func(c *Config) { c.ErrorClasses = classes })
	r := p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})[0]
	if pe := publishErr(t, r); pe.Permanent || pe.Code != "131026" {
		t.Fatalf("131026 with the override: %+v, want retryable", pe)
	}
	p = newTestPublisher(t, api, nil)
	if pe := publishErr(t, p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})[0]); !pe.Permanent {
		t.Fatalf("131026 by default: %+v, want permanent", pe)
	}
}
