package flowcatalyst_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/outbox"
)

// fakeClock is a settable outbox.Clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newClientCredentials(t *testing.T, cfg flowcatalyst.ClientCredentialsConfig) *flowcatalyst.ClientCredentials {
	t.Helper()
	cc, err := flowcatalyst.NewClientCredentials(cfg)
	if err != nil {
		t.Fatalf("NewClientCredentials: %v", err)
	}
	return cc
}

func TestClientCredentialsCachesAndRefreshesBeforeExpiry(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	tokenURL := srv.EnableOAuth("processor", "client-secret", 10*time.Minute)
	clock := newFakeClock()
	cc := newClientCredentials(t, flowcatalyst.ClientCredentialsConfig{
		TokenURL: tokenURL, ClientID: "processor", ClientSecret: "client-secret", Clock: clock,
	})
	ctx := context.Background()
	t1, err := cc.Token(ctx)
	if err != nil || t1 == "" {
		t.Fatalf("Token: %q, %v", t1, err)
	}
	clock.Advance(8 * time.Minute)
	if t2, _ := cc.Token(ctx); t2 != t1 || srv.TokenRequests() != 1 {
		t.Fatalf("token refetched before its refresh time (%d requests)", srv.TokenRequests())
	}
	// 10 min lifetime, refreshed 60 s before expiry: at 9m01s it is replaced.
	clock.Advance(61 * time.Second)
	t3, err := cc.Token(ctx)
	if err != nil || t3 == t1 || srv.TokenRequests() != 2 {
		t.Fatalf("token not refreshed before expiry: same=%v requests=%d err=%v", t3 == t1, srv.TokenRequests(), err)
	}
	cc.Invalidate()
	if t4, _ := cc.Token(ctx); t4 == t3 || srv.TokenRequests() != 3 {
		t.Fatalf("Invalidate did not force a new token")
	}
}

func TestClientCredentialsShortLifetime(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	tokenURL := srv.EnableOAuth("c", "s", 30*time.Second)
	clock := newFakeClock()
	cc := newClientCredentials(t, flowcatalyst.ClientCredentialsConfig{TokenURL: tokenURL, ClientID: "c", ClientSecret: "s", Clock: clock, AuthStyle: flowcatalyst.AuthStyleParams})
	t1, err := cc.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The margin is capped at half the lifetime: cached for 15 s.
	clock.Advance(14 * time.Second)
	if t2, _ := cc.Token(context.Background()); t2 != t1 {
		t.Fatal("a 30 s token was not cached for 15 s")
	}
	clock.Advance(2 * time.Second)
	if t3, _ := cc.Token(context.Background()); t3 == t1 {
		t.Fatal("a 30 s token was not refreshed after 16 s")
	}
}

func TestClientCredentialsConcurrentCallersShareOneFetch(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	tokenURL := srv.EnableOAuth("c", "s", time.Hour)
	cc := newClientCredentials(t, flowcatalyst.ClientCredentialsConfig{TokenURL: tokenURL, ClientID: "c", ClientSecret: "s"})
	var wg sync.WaitGroup
	tokens := make([]string, 16)
	for i := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := cc.Token(context.Background())
			if err != nil {
				t.Error(err)
			}
			tokens[i] = tok
		}()
	}
	wg.Wait()
	if srv.TokenRequests() != 1 {
		t.Errorf("%d token requests for 16 concurrent callers, want 1", srv.TokenRequests())
	}
	for _, tok := range tokens {
		if tok != tokens[0] {
			t.Fatal("callers got different tokens")
		}
	}
}

func TestClientCredentialsErrorsHideSecret(t *testing.T) {
	t.Parallel()
	const secret = "the-client-secret-987"
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	tokenURL := srv.EnableOAuth("c", "another-secret", time.Hour)
	cc := newClientCredentials(t, flowcatalyst.ClientCredentialsConfig{TokenURL: tokenURL, ClientID: "c", ClientSecret: secret})
	_, err := cc.Token(context.Background())
	var te *flowcatalyst.TokenError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v (%T), want *TokenError", err, err)
	}
	if te.StatusCode != 401 || te.Code != "invalid_client" {
		t.Errorf("TokenError = %+v", te)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error %q contains the secret", err)
	}

	// Through the Publisher: retryable "token", no request sent.
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, Token: cc})
	res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1)})
	if pe := publishError(t, res[0].Err); pe.Permanent || pe.Code != "token" || strings.Contains(pe.Message, secret) {
		t.Errorf("got %v, want retryable token error without the secret", res[0].Err)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("%d batch requests sent without a token", n)
	}
}

func TestClientCredentialsUnreachable(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	tokenURL := srv.EnableOAuth("c", "s", time.Hour)
	srv.Close()
	cc := newClientCredentials(t, flowcatalyst.ClientCredentialsConfig{TokenURL: tokenURL, ClientID: "c", ClientSecret: "s"})
	if _, err := cc.Token(context.Background()); err == nil {
		t.Fatal("Token succeeded against a closed server")
	}
}

func TestPublisherRefreshesTokenAfter401(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	tokenURL := srv.EnableOAuth("c", "s", time.Hour)
	cc := newClientCredentials(t, flowcatalyst.ClientCredentialsConfig{TokenURL: tokenURL, ClientID: "c", ClientSecret: "s"})
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, Token: cc})

	if r := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1)}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	srv.RevokeTokens() // the cached token is no longer accepted
	r := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 2)})
	if pe := publishError(t, r[0].Err); pe.Permanent || pe.Code != "http_401" {
		t.Fatalf("got %v, want retryable http_401", r[0].Err)
	}
	// The 401 dropped the cached token: the retry fetches a new one.
	if r := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 2)}); r[0].Err != nil {
		t.Fatalf("retry after 401: %v", r[0].Err)
	}
	if n := srv.TokenRequests(); n != 2 {
		t.Errorf("%d token requests, want 2", n)
	}
	reqs := srv.Requests()
	if reqs[0].Authorization == reqs[2].Authorization || !strings.HasPrefix(reqs[2].Authorization, "Bearer fc-") {
		t.Errorf("authorizations %q then %q", reqs[0].Authorization, reqs[2].Authorization)
	}
}

func TestStaticToken(t *testing.T) {
	t.Parallel()
	tok := flowcatalyst.StaticToken("abc-secret")
	if s := fmt.Sprintf("%v %s %#v", tok, tok, tok); strings.Contains(s, "abc-secret") {
		t.Errorf("formatting shows the token: %s", s)
	}
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.RequireToken("abc-secret")
	if r := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, Token: tok}).Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1)}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	r := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL}).Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1)})
	if pe := publishError(t, r[0].Err); pe.Code != "http_401" {
		t.Errorf("without a token: %v", r[0].Err)
	}
}

func TestNewClientCredentialsValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []flowcatalyst.ClientCredentialsConfig{
		{},
		{TokenURL: "not a url", ClientID: "c"},
		{TokenURL: "https://x/oauth/token"},
		{TokenURL: "https://x/oauth/token", ClientID: "c", AuthStyle: 7},
		{TokenURL: "https://x/oauth/token", ClientID: "c", Timeout: -1},
	} {
		if _, err := flowcatalyst.NewClientCredentials(cfg); err == nil {
			t.Errorf("NewClientCredentials(%+v) succeeded", cfg)
		}
	}
}
