package whatsapp

import (
	"context"
	"database/sql"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

type tenantEvents struct {
	mu              sync.Mutex
	paused, resumed []TenantEvent
}

func (o *tenantEvents) OnTenantPaused(_ context.Context, e TenantEvent) {
	o.mu.Lock()
	o.paused = append(o.paused, e)
	o.mu.Unlock()
}

func (o *tenantEvents) OnTenantResumed(_ context.Context, e TenantEvent) {
	o.mu.Lock()
	o.resumed = append(o.resumed, e)
	o.mu.Unlock()
}

// An expired token (190) pauses the tenant's sends without dead-lettering
// anything, until its credentials change; other tenants are unaffected.
func TestPublisherPausesATenantWhoseTokenIsRejected(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, r *http.Request, body map[string]any, n int) {
		if r.Header.Get("Authorization") == "Bearer "+testToken {
			writeMetaError(w, 401, 190, "Error validating access token: Session has expired")
			return
		}
		writeSuccess(w, body, n)
	})
	var mu sync.Mutex
	token := testToken
	creds := credsFunc(func(_ context.Context, tenant string) (Credentials, error) {
		c := testCreds()[tenant]
		if tenant == "org-1" {
			mu.Lock()
			c.AccessToken = token
			mu.Unlock()
		}
		return c, nil
	})
	obs := &tenantEvents{}
	p := newTestPublisher(t, api, func(c *Config) { c.Credentials, c.Observer = creds, obs })
	ctx := context.Background()

	de := deferErr(t, p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload)})[0])
	if de.Code != CodeCredentialsRejected || de.Delay != time.Minute {
		t.Fatalf("deferral = %+v; want %s for a minute", de, CodeCredentialsRejected)
	}
	// Paused: the next messages are deferred without a call to Meta.
	res := p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload), msg("org-1", textPayload)})
	for _, r := range res {
		if de := deferErr(t, r); de.Code != CodeCredentialsRejected {
			t.Fatalf("paused tenant's message: %+v", de)
		}
	}
	if n := len(api.requests()); n != 1 {
		t.Fatalf("%d calls to Meta, want 1 (the one that was rejected)", n)
	}
	// Another tenant sends as usual.
	if r := p.Publish(ctx, []outbox.Message{msg("org-2", templatePayload)})[0]; r.Err != nil {
		t.Fatalf("org-2: %v", r.Err)
	}
	obs.mu.Lock()
	if len(obs.paused) != 1 || obs.paused[0].Tenant != "org-1" || obs.paused[0].Code != "190" {
		t.Fatalf("paused events = %+v", obs.paused)
	}
	obs.mu.Unlock()

	// New credentials: the tenant resumes.
	mu.Lock()
	token = testToken + "-renewed"
	mu.Unlock()
	if r := p.Publish(ctx, []outbox.Message{msg("org-1", templatePayload)})[0]; r.Err != nil {
		t.Fatalf("after the credentials changed: %v", r.Err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.resumed) != 1 || obs.resumed[0].Tenant != "org-1" {
		t.Fatalf("resumed events = %+v", obs.resumed)
	}
	for _, e := range append(obs.paused, obs.resumed...) {
		if strings.Contains(e.Reason, testToken) {
			t.Fatal("a token leaked into an event")
		}
	}
}

// A window or quota store that fails defers the message (no attempt
// counted), and a Fallback keeps the sends going.
func TestPublisherDefersWhenTheStateStoreFails(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "wa.db"))
	if err != nil {
		t.Fatal(err)
	}
	down, err := NewSQLState(db, SQLOptions{Dialect: DialectSQLite})
	if err != nil {
		t.Fatal(err)
	}
	if err := down.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = db.Close() // the store goes away

	api := newFakeAPI(t)
	p := newTestPublisher(t, api, func(c *Config) { c.Windows, c.Quotas = down, down })
	ctx := context.Background()
	for _, payload := range []string{templatePayload, textPayload} { // quota store; window store
		de := deferErr(t, p.Publish(ctx, []outbox.Message{msg("org-1", payload)})[0])
		if de.Code != CodeStateUnavailable || de.Delay != 30*time.Second {
			t.Fatalf("deferral = %+v; want %s for 30s", de, CodeStateUnavailable)
		}
	}
	if n := len(api.requests()); n != 0 {
		t.Fatalf("%d calls to Meta without quota state, want 0", n)
	}

	// The README's wiring: the failing store first, an SQL (here memory)
	// store as the fallback.
	fb := &Fallback{Primary: down, Secondary: NewMemoryState(QuotaOptions{})}
	if err := fb.WindowTouch(ctx, "org-1", testRecipient, time.Now()); err != nil {
		t.Fatal(err)
	}
	p = newTestPublisher(t, api, func(c *Config) { c.Windows, c.Quotas = fb, fb })
	for _, payload := range []string{templatePayload, textPayload} {
		if r := p.Publish(ctx, []outbox.Message{msg("org-1", payload)})[0]; r.Err != nil {
			t.Fatalf("with a Fallback: %v", r.Err)
		}
	}
}

// The limiter never lets more than its rate through in any one-second
// window, after an idle spell or under a burst of arrivals. Send times are
// computed from the reservations on a synthetic clock, not measured.
func TestLimiterNeverExceedsTheRateInAnySecond(t *testing.T) {
	t.Parallel()
	for _, perSecond := range []float64{1, 7, 80, 100} {
		l := newLimiter(perSecond)
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var sends []time.Time
		arrive := func(at time.Time, n int) {
			for range n {
				_, wait := l.reserve("phone", at)
				sends = append(sends, at.Add(wait))
			}
		}
		arrive(t0, int(3*perSecond))                  // a burst at start (the bucket was full)
		arrive(t0.Add(time.Hour), int(2*perSecond)+1) // another after an idle hour
		arrive(t0.Add(time.Hour+1500*time.Millisecond), 5)
		for i := range sends {
			n := 0
			for j := i; j < len(sends) && sends[j].Sub(sends[i]) < time.Second; j++ {
				n++
			}
			if float64(n) > perSecond {
				t.Fatalf("rate %g: %d sends in the second from %v", perSecond, n, sends[i])
			}
		}
		// And it does not starve: the hour's burst of 2r+1 ends within about 2s.
		if last := sends[len(sends)-6]; last.Sub(t0.Add(time.Hour)) > 2*time.Second+time.Millisecond {
			t.Fatalf("rate %g: the burst took until %v", perSecond, last.Sub(t0.Add(time.Hour)))
		}
	}
}
