package whatsapp

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecretsNeverLogged drives the publisher and the webhook through their
// failure paths with debug logging and checks that no token, app secret,
// verify token or signature reaches the log.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, n int) {
		switch n % 3 {
		case 0:
			writeMetaError(w, 400, 130429, "token "+testToken)
		case 1:
			writeMetaError(w, 400, 131000, "secret "+testSecret)
		default:
			w.WriteHeader(500)
		}
	})
	state := NewMemoryState(QuotaOptions{})
	p := newTestPublisher(t, api, func(c *Config) { c.Logger, c.Quotas = logger, state })
	for i := 0; i < 6; i++ {
		p.Publish(context.Background(), []outbox.Message{msg("org-1", templatePayload)})
		_ = state.QuotaThrottle(context.Background(), "org-1", time.Time{}, time.Now())
	}
	b := newHook(t, func(c *WebhookConfig) { c.Logger = logger; c.Receipts = failingReceipts{} })
	body := statusBody(testPhoneID, st("wamid.1", "delivered", 1))
	wrong := Sign(body, "nope")
	for _, sig := range []string{"", wrong, Sign(body, testSecret)} {
		post(b.hook, body, sig)
	}
	post(b.hook, []byte("{bad"), Sign([]byte("{bad"), testSecret))
	post(b.hook, body, Sign(body, testSecret), "X-Org-Id", "org-2")
	logs := buf.String()
	if logs == "" {
		t.Fatal("nothing was logged; the test exercises nothing")
	}
	for _, secret := range []string{testToken, testSecret, testVerify, strings.TrimPrefix(wrong, "sha256="), strings.TrimPrefix(Sign(body, testSecret), "sha256=")} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a secret reached the log:\n%s", logs)
		}
	}
}

func TestRunCleanupStopsWithContext(t *testing.T) {
	t.Parallel()
	state := NewMemoryState(QuotaOptions{})
	ctx := context.Background()
	_ = state.WindowTouch(ctx, "org-1", testRecipient, time.Now().Add(-25*time.Hour))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { RunCleanup(cctx, state, time.Millisecond, nil, nil); close(done) }()
	waitFor(t, "the cleanup", 5*time.Second, func() bool { _, ok, _ := state.WindowGet(ctx, "org-1", testRecipient); return !ok })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunCleanup did not return after ctx ended")
	}
}
