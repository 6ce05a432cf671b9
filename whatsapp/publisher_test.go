package whatsapp

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

func TestPublisherSendsTemplateInWireFormat(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	p := newTestPublisher(t, api, func(c *Config) { c.APIVersion = "v24.0" })
	m := msg("org-1", templatePayload)
	res := p.Publish(context.Background(), []outbox.Message{m})
	if res[0].Err != nil {
		t.Fatalf("publish: %v", res[0].Err)
	}
	if res[0].ProviderMessageID != "wamid.TEST1" {
		t.Fatalf("ProviderMessageID = %q, want wamid.TEST1", res[0].ProviderMessageID)
	}
	if !strings.Contains(string(res[0].ProviderResponse), `"wa_id":"16505551234"`) {
		t.Fatalf("ProviderResponse = %s, want the API answer", res[0].ProviderResponse)
	}
	reqs := api.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Path != "/v24.0/"+testPhoneID+"/messages" {
		t.Fatalf("path = %q", r.Path)
	}
	if r.Auth != "Bearer "+testToken {
		t.Fatalf("Authorization = %q", r.Auth)
	}
	b := r.Body
	if b["messaging_product"] != "whatsapp" || b["recipient_type"] != "individual" || b["to"] != testRecipient || b["type"] != "template" {
		t.Fatalf("body = %v", b)
	}
	if b["biz_opaque_callback_data"] != m.ID {
		t.Fatalf("biz_opaque_callback_data = %v, want the outbox message ID %s", b["biz_opaque_callback_data"], m.ID)
	}
	tpl := b["template"].(map[string]any)
	if tpl["name"] != "order_confirmation" {
		t.Fatalf("template = %v", tpl)
	}
	if lang := tpl["language"].(map[string]any); lang["code"] != "en" {
		t.Fatalf("language = %v", lang)
	}
	comps := tpl["components"].([]any)
	if len(comps) != 1 || comps[0].(map[string]any)["type"] != "body" {
		t.Fatalf("components = %v", comps)
	}
}

func TestBuildRequestShapes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		payload  string
		template bool
		check    func(t *testing.T, b map[string]any)
		wantErr  error
	}{
		{name: "seed template with payloadJson as a string", template: true,
			payload: `{"to":"0033612345678","templateCode":"welcome","payloadJson":"{\"language\":\"fr\"}"}`,
			check: func(t *testing.T, b map[string]any) {
				if b["to"] != "+33612345678" || b["template"].(map[string]any)["language"].(map[string]any)["code"] != "fr" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "seed template without language uses the default", template: true,
			payload: `{"to":"+33612345678","templateCode":"welcome"}`,
			check: func(t *testing.T, b map[string]any) {
				if b["template"].(map[string]any)["language"].(map[string]any)["code"] != "en_US" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "seed free-form body", payload: `{"to":"+33612345678","body":"Bonjour"}`,
			check: func(t *testing.T, b map[string]any) {
				if b["type"] != "text" || b["text"].(map[string]any)["body"] != "Bonjour" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "seed free-form in payloadJson", payload: `{"to":"+33612345678","payloadJson":{"body":"Salut"}}`,
			check: func(t *testing.T, b map[string]any) {
				if b["text"].(map[string]any)["body"] != "Salut" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "native template", template: true,
			payload: `{"to":"+16505551234","type":"template","template":{"name":"order_update","language":{"code":"en_US","policy":"deterministic"},"components":[{"type":"button","sub_type":"quick_reply","index":"0","parameters":[{"type":"payload","payload":"X"}]}]}}`,
			check: func(t *testing.T, b map[string]any) {
				tpl := b["template"].(map[string]any)
				if tpl["language"].(map[string]any)["policy"] != "deterministic" || len(tpl["components"].([]any)) != 1 {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "native template without type, language as string", template: true,
			payload: `{"to":"+16505551234","template":{"name":"hello_world","language":"en_US"}}`,
			check: func(t *testing.T, b map[string]any) {
				if b["type"] != "template" || b["template"].(map[string]any)["language"].(map[string]any)["code"] != "en_US" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "native text keeps preview_url", payload: `{"to":"+16505551234","type":"text","text":{"body":"see https://x.example","preview_url":true}}`,
			check: func(t *testing.T, b map[string]any) {
				if b["text"].(map[string]any)["preview_url"] != true {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "native image passes through", payload: `{"to":"+16505551234","type":"image","image":{"link":"https://x.example/a.png"}}`,
			check: func(t *testing.T, b map[string]any) {
				if b["image"].(map[string]any)["link"] != "https://x.example/a.png" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "caller's callback data wins", template: true,
			payload: `{"to":"+16505551234","template":{"name":"t","language":"en"},"biz_opaque_callback_data":"mine"}`,
			check: func(t *testing.T, b map[string]any) {
				if b["biz_opaque_callback_data"] != "mine" {
					t.Fatalf("body = %v", b)
				}
			}},
		{name: "not an object", payload: `[1,2]`, wantErr: ErrInvalidPayload},
		{name: "no recipient", payload: `{"body":"x"}`, wantErr: ErrInvalidPayload},
		{name: "bad phone", payload: `{"to":"call me","body":"x"}`, wantErr: ErrInvalidPhone},
		{name: "no content", payload: `{"to":"+16505551234"}`, wantErr: ErrInvalidPayload},
		{name: "empty text", payload: `{"to":"+16505551234","text":{"body":"  "}}`, wantErr: ErrInvalidPayload},
		{name: "text too long", payload: `{"to":"+16505551234","body":"` + strings.Repeat("é", MaxTextLength+1) + `"}`, wantErr: ErrInvalidPayload},
		{name: "template without name", payload: `{"to":"+16505551234","template":{"language":"en"}}`, wantErr: ErrInvalidPayload},
		{name: "components not an array", payload: `{"to":"+16505551234","templateCode":"x","payloadJson":{"language":"en","components":{}}}`, wantErr: ErrInvalidPayload},
		{name: "type without its object", payload: `{"to":"+16505551234","type":"image"}`, wantErr: ErrInvalidPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := BuildRequest([]byte(tt.payload), "en_US", "cb")
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("BuildRequest: %v", err)
			}
			if req.Template != tt.template {
				t.Fatalf("Template = %v, want %v", req.Template, tt.template)
			}
			var b map[string]any
			if err := jsonUnmarshal(req.Body, &b); err != nil {
				t.Fatal(err)
			}
			if b["messaging_product"] != "whatsapp" {
				t.Fatalf("messaging_product missing: %v", b)
			}
			tt.check(t, b)
		})
	}
}

func TestNormalizePhone(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"+1 (650) 555-1234":  "+16505551234",
		"16505551234":        "+16505551234",
		"0033 6 12 34 56 78": "+33612345678",
		"+33.6.12.34.56.78":  "+33612345678",
	} {
		got, err := NormalizePhone(in)
		if err != nil || got != want {
			t.Errorf("NormalizePhone(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "+", "12345", "0612345678", "+1234567890123456", "+1-800-FLOWERS", "1+2345678"} {
		if got, err := NormalizePhone(in); !errors.Is(err, ErrInvalidPhone) {
			t.Errorf("NormalizePhone(%q) = %q, %v; want ErrInvalidPhone", in, got, err)
		}
	}
}

// TestPublisherHTTPFailures: Meta's error code decides, not the HTTP status.
// Rate limits (429, rate-limit codes) are deferred without an attempt
// counted; other retryable failures count as attempts (and so end in the
// dead letter after MaxAttempts); permanent ones dead-letter at once.
func TestPublisherHTTPFailures(t *testing.T) {
	t.Parallel()
	const (
		permanent = iota
		retry     // counted attempt
		deferred  // no attempt counted
	)
	tests := []struct {
		name       string
		handle     func(w http.ResponseWriter)
		code       string
		kind       int
		retryAfter time.Duration
	}{
		{"400 with Meta code", func(w http.ResponseWriter) { writeMetaError(w, 400, 131009, "Parameter value is not valid") }, "131009", permanent, 0},
		{"400 without body", func(w http.ResponseWriter) { w.WriteHeader(400) }, "http_400", permanent, 0},
		{"401 with code 190: the tenant pauses", func(w http.ResponseWriter) { writeMetaError(w, 401, 190, "token expired") }, CodeCredentialsRejected, deferred, time.Minute},
		{"401 without body", func(w http.ResponseWriter) { w.WriteHeader(401) }, "http_401", permanent, 0},
		{"429 without body, Retry-After", func(w http.ResponseWriter) { w.Header().Set("Retry-After", "120"); w.WriteHeader(429) }, "http_429", deferred, 2 * time.Minute},
		{"429 without body or Retry-After", func(w http.ResponseWriter) { w.WriteHeader(429) }, "http_429", deferred, time.Minute},
		{"429 with rate-limit code", func(w http.ResponseWriter) {
			writeMetaError(w, 429, 130429, "Cloud API message throughput has been reached.")
		}, "130429", deferred, 5 * time.Second},
		{"rate-limit code with Retry-After", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "30")
			writeMetaError(w, 429, 130429, "Cloud API message throughput has been reached.")
		}, "130429", deferred, 30 * time.Second},
		{"400 with rate-limit code (newer tables)", func(w http.ResponseWriter) { writeMetaError(w, 400, 80007, "") }, "80007", deferred, 5 * time.Minute},
		{"unknown code whose details speak of a rate limit", func(w http.ResponseWriter) { writeMetaError(w, 400, 999998, "Rate limit hit") }, "999998", deferred, time.Minute},
		{"500 with retryable code", func(w http.ResponseWriter) { writeMetaError(w, 500, 131000, "Something went wrong") }, "131000", retry, 0},
		{"500 without body", func(w http.ResponseWriter) { w.WriteHeader(500) }, "http_500", retry, 0},
		{"503 with HTML body", func(w http.ResponseWriter) { w.WriteHeader(503); _, _ = w.Write([]byte("<html>down</html>")) }, "http_503", retry, 0},
		{"500 with a permanent code: the code wins over the status", func(w http.ResponseWriter) { writeMetaError(w, 500, 131026, "") }, "131026", permanent, 0},
		{"200 with malformed JSON", func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"messages":[`)) }, CodeBadResponse, retry, 0},
		{"200 without message id", func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"messages":[]}`)) }, CodeBadResponse, retry, 0},
		{"error JSON without code", func(w http.ResponseWriter) { w.WriteHeader(400); _, _ = w.Write([]byte(`{"error":{"message":"x"}}`)) }, "http_400", permanent, 0},
		{"unknown code is retryable", func(w http.ResponseWriter) { writeMetaError(w, 400, 999999, "") }, "999999", retry, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			api := newFakeAPI(t)
			api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, _ int) { tt.handle(w) })
			p := newTestPublisher(t, api, nil)
			res := p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})
			if tt.kind == deferred {
				de := deferErr(t, res[0])
				if de.Code != tt.code || de.Delay != tt.retryAfter {
					t.Fatalf("got code=%q delay=%v (%s); want %q %v", de.Code, de.Delay, de.Message, tt.code, tt.retryAfter)
				}
				return
			}
			pe := publishErr(t, res[0])
			if pe.Code != tt.code || pe.Permanent != (tt.kind == permanent) || pe.RetryAfter != tt.retryAfter {
				t.Fatalf("got code=%q permanent=%v retryAfter=%v (%s); want %q %v %v", pe.Code, pe.Permanent, pe.RetryAfter, pe.Message, tt.code, tt.kind == permanent, tt.retryAfter)
			}
			if outbox.IsRetryable(res[0].Err) != (tt.kind == retry) {
				t.Fatalf("IsRetryable = %v for kind %d", outbox.IsRetryable(res[0].Err), tt.kind)
			}
			if errors.Is(res[0].Err, outbox.ErrNotAttempted) {
				t.Fatal("a failed send must count as an attempt")
			}
		})
	}
}

func TestPublisherTimeout(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	api.setHandler(func(w http.ResponseWriter, r *http.Request, _ map[string]any, _ int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	p := newTestPublisher(t, api, func(c *Config) { c.Timeout = 100 * time.Millisecond })
	start := time.Now()
	res := p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("publish took %v with a 100ms timeout", el)
	}
	pe := publishErr(t, res[0])
	if pe.Code != CodeTimeout || pe.Permanent {
		t.Fatalf("got %q permanent=%v, want a retryable timeout", pe.Code, pe.Permanent)
	}
}

func TestPublisherHonoursContext(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	api.setHandler(func(w http.ResponseWriter, r *http.Request, _ map[string]any, _ int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	p := newTestPublisher(t, api, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res := p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload), msg("org-1", templatePayload)})
	if res[0].Err == nil || !outbox.IsRetryable(res[0].Err) {
		t.Fatalf("first = %v, want a retryable error", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) || !errors.Is(res[1].Err, context.DeadlineExceeded) {
		t.Fatalf("second = %v, want ErrNotAttempted and the context's error", res[1].Err)
	}
}

func TestPublisherNetworkError(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	api.srv.Close()
	p := newTestPublisher(t, api, nil)
	res := p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})
	pe := publishErr(t, res[0])
	if pe.Code != CodeNetwork || pe.Permanent {
		t.Fatalf("got %q permanent=%v", pe.Code, pe.Permanent)
	}
}

// TestSecretsNeverStored makes the fake API echo the token in every place it
// can and checks that neither the stored error nor the recorded response
// carries it.
func TestSecretsNeverStored(t *testing.T) {
	t.Parallel()
	handlers := map[string]func(w http.ResponseWriter){
		"in Meta's message": func(w http.ResponseWriter) {
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"error":{"message":"Invalid OAuth access token ` + testToken + `","code":190,"error_data":{"details":"token ` + testToken + ` app ` + testSecret + `"}}}`))
		},
		"in a body without code": func(w http.ResponseWriter) {
			w.WriteHeader(500)
			_, _ = w.Write([]byte(`{"token":"` + testToken + `"}`))
		},
		"in a 200 without id": func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"echo":"` + testToken + `"}`)) },
	}
	for name, h := range handlers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			api := newFakeAPI(t)
			api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, _ int) { h(w) })
			p := newTestPublisher(t, api, nil)
			res := p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})
			info := outbox.ErrorInfoOf(res[0].Err)
			for _, s := range []string{info.Code, info.Message, res[0].Err.Error(), string(res[0].ProviderResponse)} {
				if strings.Contains(s, testToken) || strings.Contains(s, testSecret) {
					t.Fatalf("a secret leaked: %q", s)
				}
			}
		})
	}
	if s := testCreds()["org-1"].String(); strings.Contains(s, testToken) || strings.Contains(s, testSecret) {
		t.Fatalf("Credentials.String leaks: %s", s)
	}
}

func TestPublisherGroupStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, body map[string]any, n int) {
		if body["biz_opaque_callback_data"] == "g1-2" {
			writeMetaError(w, 500, 131016, "")
			return
		}
		writeSuccess(w, body, n)
	})
	p := newTestPublisher(t, api, nil)
	mk := func(id, group string) outbox.Message {
		m := msg("org-1", templatePayload)
		m.ID, m.Group = id, group
		return m
	}
	batch := []outbox.Message{mk("g1-1", "g1"), mk("g1-2", "g1"), mk("u-1", ""), mk("g1-3", "g1"), mk("g2-1", "g2")}
	res := p.Publish(context.Background(), batch)
	if res[0].Err != nil || res[2].Err != nil || res[4].Err != nil {
		t.Fatalf("unrelated messages failed: %v %v %v", res[0].Err, res[2].Err, res[4].Err)
	}
	if pe := publishErr(t, res[1]); pe.Code != "131016" {
		t.Fatalf("g1-2: %v", pe)
	}
	if !errors.Is(res[3].Err, outbox.ErrNotAttempted) {
		t.Fatalf("g1-3 = %v, want ErrNotAttempted", res[3].Err)
	}
	if n := len(api.requests()); n != 4 {
		t.Fatalf("%d requests, want 4 (g1-3 not sent)", n)
	}
}

func TestPublisherCredentials(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	p := newTestPublisher(t, api, nil)
	res := p.Publish(context.Background(), []outbox.Message{msg("nobody", templatePayload), msg("org-2", templatePayload)})
	if pe := publishErr(t, res[0]); pe.Code != CodeUnknownTenant || !pe.Permanent {
		t.Fatalf("unknown tenant: %v", pe)
	}
	if res[1].Err != nil {
		t.Fatal(res[1].Err)
	}
	reqs := api.requests()
	if len(reqs) != 1 || reqs[0].Path != "/"+DefaultAPIVersion+"/"+testPhoneID2+"/messages" || reqs[0].Auth != "Bearer "+testToken+"-2" {
		t.Fatalf("tenant org-2 must use its own number and token: %+v", reqs)
	}
	flaky := credsFunc(func(context.Context, string) (Credentials, error) { return Credentials{}, errors.New("vault down") })
	p2 := newTestPublisher(t, api, func(c *Config) { c.Credentials = flaky })
	if pe := publishErr(t, p2.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})[0]); pe.Code != CodeCredentials || pe.Permanent {
		t.Fatalf("provider failure: %v", pe)
	}
}

type credsFunc func(context.Context, string) (Credentials, error)

func (f credsFunc) Credentials(ctx context.Context, t string) (Credentials, error) { return f(ctx, t) }
func (f credsFunc) TenantByPhoneNumberID(context.Context, string) (string, error) {
	return "", ErrUnknownTenant
}

func TestPublisherInvalidPayloadIsPermanentWithoutCall(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	p := newTestPublisher(t, api, nil)
	res := p.Publish(context.Background(), []outbox.Message{msg("org-1", `{"to":"nope","body":"x"}`), msg("org-1", `{"to":"+16505551234"}`)})
	if pe := publishErr(t, res[0]); pe.Code != CodeInvalidPhone || !pe.Permanent {
		t.Fatalf("bad phone: %v", pe)
	}
	if pe := publishErr(t, res[1]); pe.Code != CodeInvalidPayload || !pe.Permanent {
		t.Fatalf("no content: %v", pe)
	}
	if n := len(api.requests()); n != 0 {
		t.Fatalf("%d requests, want none", n)
	}
}

func TestPublisherSessionWindow(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	clock := newFakeClock(time.Now())
	state := NewMemoryState(QuotaOptions{})
	p := newTestPublisher(t, api, func(c *Config) { c.Windows, c.Clock = state, clock })
	ctx := context.Background()
	send := func(payload string) outbox.Result { return p.Publish(ctx, []outbox.Message{msg("org-1", payload)})[0] }

	// never wrote: free-form refused before any HTTP call, templates allowed
	if pe := publishErr(t, send(textPayload)); pe.Code != CodeWindowClosed || !pe.Permanent {
		t.Fatalf("outside window: %v", pe)
	}
	if n := len(api.requests()); n != 0 {
		t.Fatalf("%d requests for a refused free-form message", n)
	}
	if r := send(templatePayload); r.Err != nil {
		t.Fatalf("template outside window: %v", r.Err)
	}
	// the user writes: free-form allowed for 24 h
	if err := state.WindowTouch(ctx, "org-1", testRecipient, clock.Now()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(23 * time.Hour)
	if r := send(textPayload); r.Err != nil {
		t.Fatalf("inside window: %v", r.Err)
	}
	// our own messages do not refresh it
	clock.Advance(time.Hour + time.Second)
	if pe := publishErr(t, send(textPayload)); pe.Code != CodeWindowClosed {
		t.Fatalf("after 24h: %v", pe)
	}
	// another tenant's window does not count
	if err := state.WindowTouch(ctx, "org-2", testRecipient, clock.Now()); err != nil {
		t.Fatal(err)
	}
	if pe := publishErr(t, send(textPayload)); pe.Code != CodeWindowClosed {
		t.Fatalf("org-2's window opened org-1's: %v", pe)
	}
}

func TestPublisherQuotaAndThrottle(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	clock := newFakeClock(time.Now())
	state := NewMemoryState(QuotaOptions{DefaultLimit: 2})
	p := newTestPublisher(t, api, func(c *Config) { c.Quotas, c.Clock = state, clock })
	ctx := context.Background()
	send := func(tenant string) outbox.Result {
		return p.Publish(ctx, []outbox.Message{msg(tenant, templatePayload)})[0]
	}
	for i := 0; i < 2; i++ {
		if r := send("org-1"); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	de := deferErr(t, send("org-1"))
	if de.Code != CodeQuotaExceeded || de.Delay < 24*time.Hour-time.Second || de.Delay > 24*time.Hour {
		t.Fatalf("quota exceeded: code=%q delay=%v", de.Code, de.Delay)
	}
	if n := len(api.requests()); n != 2 {
		t.Fatalf("%d requests; a message over quota must not reach the API", n)
	}
	if r := send("org-2"); r.Err != nil {
		t.Fatalf("org-2 has its own quota: %v", r.Err)
	}
	clock.Advance(24 * time.Hour)
	if r := send("org-1"); r.Err != nil {
		t.Fatalf("after the window reset: %v", r.Err)
	}

	// A rate-limit answer throttles the tenant: its next message waits
	// without an HTTP call, another tenant is unaffected.
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, _ int) {
		writeMetaError(w, 400, 130429, "Cloud API message throughput has been reached.")
	})
	if de := deferErr(t, send("org-2")); de.Code != "130429" || de.Delay != 5*time.Second {
		t.Fatalf("rate limit: %v", de)
	}
	before := len(api.requests())
	api.setHandler(nil)
	de = deferErr(t, send("org-2"))
	if de.Code != CodeThrottled || de.Delay != 5*time.Second {
		t.Fatalf("throttled: %q %v", de.Code, de.Delay)
	}
	if len(api.requests()) != before {
		t.Fatal("a throttled tenant's message reached the API")
	}
	st, _ := state.QuotaGet(ctx, "org-2", clock.Now())
	if !st.Throttled {
		t.Fatalf("status = %+v, want throttled", st)
	}
	clock.Advance(6 * time.Second)
	if r := send("org-2"); r.Err != nil {
		t.Fatalf("after the throttle: %v", r.Err)
	}
}

func TestPublisherPairRateLimit(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	clock := newFakeClock(time.Now())
	p := newTestPublisher(t, api, func(c *Config) { c.Clock = clock })
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, body map[string]any, n int) {
		if body["to"] == testRecipient {
			writeMetaError(w, 400, 131056, "Too many messages sent from the sender phone number to the same recipient phone number in a short period of time.")
			return
		}
		writeSuccess(w, body, n)
	})
	ctx := context.Background()
	var waits []time.Duration
	for i := 0; i < 3; i++ {
		de := deferErr(t, p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload)})[0])
		if de.Code != "131056" {
			t.Fatalf("pair limit: %v", de)
		}
		waits = append(waits, de.Delay)
		// while throttled, the pair is not called
		n := len(api.requests())
		if de2 := deferErr(t, p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload)})[0]); de2.Code != CodeThrottled || de2.Delay != de.Delay {
			t.Fatalf("during the pair throttle: %v", de2)
		}
		if len(api.requests()) != n {
			t.Fatal("a throttled pair reached the API")
		}
		clock.Advance(de.Delay)
	}
	if waits[0] != time.Second || waits[1] != 4*time.Second || waits[2] != 16*time.Second {
		t.Fatalf("waits = %v, want Meta's 4^X s: 1s 4s 16s", waits)
	}
	// other recipients are unaffected
	if r := p.Publish(ctx, []outbox.Message{msg("org-1", `{"to":"+33612345678","templateCode":"x"}`)})[0]; r.Err != nil {
		t.Fatalf("another recipient: %v", r.Err)
	}
}

func TestPublisherThroughputLimit(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	p := newTestPublisher(t, api, func(c *Config) { c.Throughput = 20 })
	msgs := make([]outbox.Message, 30)
	for i := range msgs {
		msgs[i] = msg("org-1", templatePayload)
	}
	start := time.Now()
	for _, r := range p.Publish(context.Background(), msgs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// one at once, then 29 more at 20/s: about 1.45 s
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("30 messages at 20/s took %v", el)
	}
}

// TestPublisherThroughputDefers: concurrent sends beyond the per-number
// throughput do not wait more than a second holding their lease; they are
// deferred (no attempt counted, quota not consumed) for about the time they
// would have waited.
func TestPublisherThroughputDefers(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	state := NewMemoryState(QuotaOptions{})
	p := newTestPublisher(t, api, func(c *Config) { c.Throughput, c.Quotas = 10, state })
	const n = 30
	results := make([]outbox.Result, n)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			m := msg("org-1", templatePayload)
			results[i] = p.Send(context.Background(), &m)
		})
	}
	wg.Wait()
	sent, deferred := 0, 0
	for _, r := range results {
		if r.Err == nil {
			sent++
			continue
		}
		de := deferErr(t, r)
		if de.Code != CodeThrottled || de.Delay <= time.Second || de.Delay > 3*time.Second {
			t.Fatalf("deferral %q after %v, want %q after 1-3s", de.Code, de.Delay, CodeThrottled)
		}
		deferred++
	}
	// one at once, then up to a second of waiting at 10/s: about 11 sent
	if sent < 10 || sent > 13 || sent+deferred != n {
		t.Fatalf("%d sent, %d deferred; want about 11 sent and the rest deferred", sent, deferred)
	}
	if got := len(api.requests()); got != sent {
		t.Fatalf("%d API calls for %d sent messages", got, sent)
	}
	if st, _ := state.QuotaGet(context.Background(), "org-1", time.Now()); st.Sent != int64(sent) {
		t.Fatalf("quota counted %d, want %d: a deferred message is not counted", st.Sent, sent)
	}
}

func TestNewPublisherValidates(t *testing.T) {
	t.Parallel()
	if _, err := NewPublisher(Config{}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("no credentials: %v", err)
	}
	if _, err := NewPublisher(Config{Credentials: testCreds(), BaseURL: "ftp://x"}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("bad base URL: %v", err)
	}
	if _, err := NewPublisher(Config{Credentials: testCreds(), APIVersion: "v1/../x"}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("bad version: %v", err)
	}
}
