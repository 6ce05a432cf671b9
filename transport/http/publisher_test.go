package http_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	outboxhttp "github.com/outboxkit/outboxkit/transport/http"
)

type request struct {
	header http.Header
	body   string
}

// server records requests and answers each with respond.
type server struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []request
}

func newServer(t *testing.T, respond func(w http.ResponseWriter, r *http.Request, body string)) *server {
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, request{r.Header.Clone(), string(b)})
		s.mu.Unlock()
		respond(w, r, string(b))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.reqs...)
}

func newPublisher(t *testing.T, cfg outboxhttp.Config) *outboxhttp.Publisher {
	t.Helper()
	p, err := outboxhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func msg(id, group, payload string) outbox.Message {
	return outbox.Message{ID: id, Tenant: "acme", Topic: "orders", Group: group, Payload: []byte(payload),
		Headers: map[string]string{"Traceparent": "00-" + id}}
}

func code(err error) string {
	var pe *outbox.PublishError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func TestPublishEachWithHeadersAndSignature(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ string) { _, _ = io.WriteString(w, `{"ok":true}`) })
	secret := []byte("per-tenant-secret")
	p := newPublisher(t, outboxhttp.Config{
		URL:     s.URL + "/hook?token=query-secret",
		Headers: http.Header{"Authorization": {"Bearer static-token"}},
		Secret: func(_ context.Context, tenant string) ([]byte, error) {
			if tenant != "acme" {
				return nil, errors.New("unknown tenant")
			}
			return secret, nil
		},
	})
	res := p.Publish(context.Background(), []outbox.Message{msg("a", "g", `{"n":1}`), msg("b", "", `{"n":2}`)})
	for i, r := range res {
		if r.Err != nil || string(r.ProviderResponse) != `{"ok":true}` {
			t.Fatalf("message %d: %+v", i, r)
		}
	}
	reqs := s.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	for k, v := range map[string]string{
		"Idempotency-Key": "a", "X-Outbox-Id": "a", "X-Outbox-Tenant": "acme", "X-Outbox-Topic": "orders",
		"X-Outbox-Group": "g", "Content-Type": "application/json", "Authorization": "Bearer static-token",
		"Traceparent": "00-a",
	} {
		if got := r.header.Get(k); got != v {
			t.Fatalf("header %s = %q, want %q", k, got, v)
		}
	}
	if r.body != `{"n":1}` || !outboxhttp.Verify(secret, []byte(r.body), r.header.Get("X-Outbox-Signature")) {
		t.Fatalf("body %s, signature %s", r.body, r.header.Get("X-Outbox-Signature"))
	}
	if reqs[1].header.Get("X-Outbox-Group") != "" {
		t.Fatal("group header on an unordered message")
	}
	if outboxhttp.Verify([]byte("other"), []byte(r.body), r.header.Get("X-Outbox-Signature")) {
		t.Fatal("Verify accepted a wrong secret")
	}

	// An unknown tenant: retryable, nothing sent.
	m := msg("c", "", `{}`)
	m.Tenant = "other"
	res = p.Publish(context.Background(), []outbox.Message{m})
	if code(res[0].Err) != "secret" || !outbox.IsRetryable(res[0].Err) || len(s.requests()) != 2 {
		t.Fatalf("unknown tenant: %v", res[0].Err)
	}
}

func TestStatusMapping(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status     int
		retryAfter string
		code       string
		retryable  bool
		delay      time.Duration
	}{
		{200, "", "", false, 0},
		{204, "", "", false, 0},
		{400, "", "http_400", false, 0},
		{404, "", "http_404", false, 0},
		{422, "", "http_422", false, 0},
		{408, "", "http_408", true, 0},
		{429, "7", "http_429", true, 7 * time.Second},
		{500, "", "http_500", true, 0},
		{503, time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), "http_503", true, time.Hour},
		{302, "", "http_302", true, 0},
	}
	for _, c := range cases {
		s := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ string) {
			if c.retryAfter != "" {
				w.Header().Set("Retry-After", c.retryAfter)
			}
			w.WriteHeader(c.status)
			_, _ = io.WriteString(w, `{"error":"echo Bearer static-token sig-secret"}`)
		})
		p := newPublisher(t, outboxhttp.Config{URL: s.URL, Headers: http.Header{"Authorization": {"Bearer static-token"}},
			Secret: func(context.Context, string) ([]byte, error) { return []byte("sig-secret"), nil }})
		res := p.Publish(context.Background(), []outbox.Message{msg("a", "", `{}`)})
		err := res[0].Err
		if c.code == "" {
			if err != nil {
				t.Fatalf("%d: %v", c.status, err)
			}
			continue
		}
		if code(err) != c.code || outbox.IsRetryable(err) != c.retryable {
			t.Fatalf("%d: %v", c.status, err)
		}
		if d := outbox.RetryDelayOf(err); d > c.delay || d < c.delay-2*time.Second {
			t.Fatalf("%d: delay %s, want %s", c.status, d, c.delay)
		}
		if s := err.Error(); strings.Contains(s, "static-token") || strings.Contains(s, "sig-secret") {
			t.Fatalf("%d: secret in error: %s", c.status, s)
		}
	}
}

func TestGroupStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request, body string) {
		if body == `{"n":1}` {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	p := newPublisher(t, outboxhttp.Config{URL: s.URL})
	res := p.Publish(context.Background(), []outbox.Message{
		msg("a", "g", `{"n":1}`), msg("b", "g", `{"n":2}`), msg("c", "", `{"n":3}`),
	})
	if code(res[0].Err) != "http_503" || !errors.Is(res[1].Err, outbox.ErrNotAttempted) || res[2].Err != nil {
		t.Fatalf("%v / %v / %v", res[0].Err, res[1].Err, res[2].Err)
	}
	if n := len(s.requests()); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()
	fail := false
	var mu sync.Mutex
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ string) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	p := newPublisher(t, outboxhttp.Config{URL: s.URL, Batch: true, MaxBatchSize: 2})
	other := msg("x", "", `{"n":9}`)
	other.Tenant = "globex"
	msgs := []outbox.Message{msg("a", "g", `{"n":1}`), other, msg("b", "g", `{"n":2}`), msg("c", "", `{"n":3}`)}
	res := p.Publish(context.Background(), msgs)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	reqs := s.requests()
	if len(reqs) != 3 { // acme [a b], acme [c], globex [x]
		t.Fatalf("%d requests", len(reqs))
	}
	var envs []outboxhttp.Envelope
	if err := json.Unmarshal([]byte(reqs[0].body), &envs); err != nil {
		t.Fatal(err)
	}
	if len(envs) != 2 || envs[0].ID != "a" || envs[1].ID != "b" || string(envs[1].Payload) != `{"n":2}` ||
		envs[0].Group != "g" || envs[0].Headers["Traceparent"] != "00-a" || reqs[0].header.Get("X-Outbox-Tenant") != "acme" {
		t.Fatalf("first batch %s", reqs[0].body)
	}
	if reqs[2].header.Get("X-Outbox-Tenant") != "globex" || reqs[0].header.Get("Idempotency-Key") == "" {
		t.Fatalf("headers %v", reqs[2].header)
	}

	// A failed batch: the first message of the group carries the error,
	// the rest of the group is not attempted.
	mu.Lock()
	fail = true
	mu.Unlock()
	res = p.Publish(context.Background(), msgs[:3])
	if code(res[0].Err) != "http_502" || !errors.Is(res[2].Err, outbox.ErrNotAttempted) || code(res[1].Err) != "http_502" {
		t.Fatalf("%v / %v / %v", res[0].Err, res[1].Err, res[2].Err)
	}
}

func TestCancelAndTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	p := newPublisher(t, outboxhttp.Config{URL: s.URL, RequestTimeout: 100 * time.Millisecond})
	res := p.Publish(context.Background(), []outbox.Message{msg("a", "g", `{}`), msg("b", "g", `{}`)})
	if code(res[0].Err) != "timeout" || !outbox.IsRetryable(res[0].Err) || !errors.Is(res[1].Err, outbox.ErrNotAttempted) {
		t.Fatalf("%v / %v", res[0].Err, res[1].Err)
	}

	p = newPublisher(t, outboxhttp.Config{URL: s.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res = p.Publish(ctx, []outbox.Message{msg("a", "", `{}`), msg("b", "", `{}`)})
	if !errors.Is(res[0].Err, context.DeadlineExceeded) || errors.Is(res[0].Err, outbox.ErrNotAttempted) {
		t.Fatalf("in flight: %v", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) || !errors.Is(res[1].Err, context.DeadlineExceeded) {
		t.Fatalf("not sent: %v", res[1].Err)
	}
}

func TestTransportErrorHidesQuery(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, outboxhttp.Config{URL: "http://127.0.0.1:1/hook?token=query-secret"})
	res := p.Publish(context.Background(), []outbox.Message{msg("a", "", `{}`)})
	if code(res[0].Err) != "transport" || strings.Contains(res[0].Err.Error(), "query-secret") {
		t.Fatalf("%v", res[0].Err)
	}
}

func TestBadHeader(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(http.ResponseWriter, *http.Request, string) {})
	p := newPublisher(t, outboxhttp.Config{URL: s.URL})
	m := msg("a", "", `{}`)
	m.Headers["bad name"] = "v"
	m2 := msg("b", "", `{}`)
	m2.Headers["X-Ok"] = "line\r\nInjected: yes"
	res := p.Publish(context.Background(), []outbox.Message{m, m2})
	for i, r := range res {
		if code(r.Err) != "header" || outbox.IsRetryable(r.Err) {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	if len(s.requests()) != 0 {
		t.Fatal("a request was sent")
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxhttp.Config{
		{},
		{URL: "ftp://x"},
		{URL: "http://x", MaxBatchSize: -1},
		{URL: "http://x", SignatureHeader: "bad header"},
		{URL: "http://x", Headers: http.Header{"bad:": {"v"}}},
		// Options that would do nothing.
		{URL: "http://x", SignatureHeader: "X-Sig"},
		{URL: "http://x", MaxBatchSize: 10},
	} {
		if _, err := outboxhttp.New(cfg); err == nil {
			t.Fatalf("New(%+v) = nil error", cfg)
		}
	}
	secret := func(context.Context, string) ([]byte, error) { return []byte("k"), nil }
	for _, cfg := range []outboxhttp.Config{
		{URL: "http://x", SignatureHeader: "X-Sig", Secret: secret},
		{URL: "http://x", MaxBatchSize: 10, Batch: true},
	} {
		if _, err := outboxhttp.New(cfg); err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
	}
}
