package whatsapp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

const (
	testToken     = "EAAG-secret-access-token-0123456789"
	testSecret    = "app_secret_123"
	testVerify    = "verify-me-please"
	testPhoneID   = "106540352242922"
	testPhoneID2  = "206540352242922"
	testRecipient = "+16505551234"
)

// fakeAPI is an httptest Cloud API: it records requests and answers with
// handle (by default a success with wamid.N).
type fakeAPI struct {
	srv *httptest.Server
	mu  sync.Mutex
	// requests seen
	reqs []fakeReq
	// handle answers one request; nil means success.
	handle func(w http.ResponseWriter, r *http.Request, body map[string]any, n int)
}

type fakeReq struct {
	Path, Auth string
	Body       map[string]any
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		f.mu.Lock()
		f.reqs = append(f.reqs, fakeReq{Path: r.URL.Path, Auth: r.Header.Get("Authorization"), Body: body})
		n := len(f.reqs)
		h := f.handle
		f.mu.Unlock()
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/messages") {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if h != nil {
			h(w, r, body, n)
			return
		}
		writeSuccess(w, body, n)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func writeSuccess(w http.ResponseWriter, body map[string]any, n int) {
	to, _ := body["to"].(string)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"messaging_product":"whatsapp","contacts":[{"input":%q,"wa_id":%q}],"messages":[{"id":"wamid.TEST%d"}]}`,
		to, strings.TrimPrefix(to, "+"), n)
}

func writeMetaError(w http.ResponseWriter, status, code int, details string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":"(#%d) Some title","type":"OAuthException","code":%d,"error_data":{"messaging_product":"whatsapp","details":%q},"fbtrace_id":"Az8or2yhqkZfEZ-_4Qn_Bam"}}`, code, code, details)
}

func (f *fakeAPI) setHandler(h func(w http.ResponseWriter, r *http.Request, body map[string]any, n int)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handle = h
}

func (f *fakeAPI) requests() []fakeReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeReq(nil), f.reqs...)
}

// fakeClock is a settable outbox.Clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{t: t.UTC()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func testCreds() StaticCredentials {
	return StaticCredentials{
		"org-1": {PhoneNumberID: testPhoneID, AccessToken: testToken, AppSecret: testSecret, VerifyToken: testVerify},
		"org-2": {PhoneNumberID: testPhoneID2, AccessToken: testToken + "-2", AppSecret: "other_secret_456", VerifyToken: "verify-2"},
	}
}

func newTestPublisher(t *testing.T, api *fakeAPI, mod func(*Config)) *Publisher {
	t.Helper()
	cfg := Config{Credentials: testCreds(), BaseURL: api.srv.URL, Timeout: 2 * time.Second, Throughput: -1}
	if mod != nil {
		mod(&cfg)
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	return p
}

func msg(tenant, payload string) outbox.Message {
	return outbox.Message{ID: outbox.NewID(time.Now()), Tenant: tenant, Topic: "whatsapp", Payload: json.RawMessage(payload), Attempts: 1}
}

const templatePayload = `{"to":"+1 (650) 555-1234","templateCode":"order_confirmation","payloadJson":{"language":"en","components":[{"type":"body","parameters":[{"type":"text","text":"John Doe"}]}]}}`
const textPayload = `{"to":"+16505551234","body":"Hello there"}`

// publishErr returns the *outbox.PublishError of r or fails.
func publishErr(t *testing.T, r outbox.Result) *outbox.PublishError {
	t.Helper()
	pe, ok := r.Err.(*outbox.PublishError)
	if !ok {
		t.Fatalf("result error = %#v (%v), want *outbox.PublishError", r.Err, r.Err)
	}
	return pe
}

// deferErr returns the *outbox.DeferError of r or fails: the message is to
// be tried again later without an attempt counted.
func deferErr(t *testing.T, r outbox.Result) *outbox.DeferError {
	t.Helper()
	de, ok := r.Err.(*outbox.DeferError)
	if !ok {
		t.Fatalf("result error = %#v (%v), want *outbox.DeferError (deferred, no attempt counted)", r.Err, r.Err)
	}
	if !errors.Is(r.Err, outbox.ErrNotAttempted) || de.Delay < time.Second {
		t.Fatalf("deferral %v: must match ErrNotAttempted and wait at least a second", r.Err)
	}
	return de
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
