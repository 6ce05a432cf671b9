package whatsapp

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

func TestSignatureVectors(t *testing.T) {
	t.Parallel()
	if got := Sign([]byte("test"), "secret"); got != "sha256=0329a06b62cd16b33eb6792be8c60b158d89a2ee3a876fce9a881ebb488c0914" {
		t.Fatalf("Sign(test, secret) = %s", got)
	}
	body := []byte(`{"object":"whatsapp_business_account","entry":[]}`)
	const want = "sha256=02fe0c96d28c59ddb7cf81eff0ca05809b360ba73b63c28210b5906a0a107d1f"
	if got := Sign(body, "app_secret_123"); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if err := VerifySignature(body, want, "app_secret_123"); err != nil {
		t.Fatalf("valid signature refused: %v", err)
	}
	for name, tc := range map[string]struct {
		header, secret string
		body           []byte
		want           error
	}{
		"missing":      {"", "app_secret_123", body, ErrSignatureMissing},
		"wrong secret": {want, "other", body, ErrSignatureInvalid},
		"body changed": {want, "app_secret_123", append(append([]byte{}, body...), ' '), ErrSignatureInvalid},
		"no prefix":    {strings.TrimPrefix(want, "sha256="), "app_secret_123", body, ErrSignatureInvalid},
		"sha1 prefix":  {"sha1=" + strings.TrimPrefix(want, "sha256="), "app_secret_123", body, ErrSignatureInvalid},
		"truncated":    {want[:40], "app_secret_123", body, ErrSignatureInvalid},
		"not hex":      {"sha256=" + strings.Repeat("zz", 32), "app_secret_123", body, ErrSignatureInvalid},
		"empty secret": {Sign(body, ""), "", body, ErrSignatureInvalid},
	} {
		if err := VerifySignature(tc.body, tc.header, tc.secret); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	// the signature covers the raw bytes, escaped unicode included
	raw := []byte(`{"text":"\u00e4\u00f6\u00e5 @"}`)
	if err := VerifySignature(raw, Sign(raw, "s"), "s"); err != nil {
		t.Fatal(err)
	}
}

// recObserver records observer hooks.
type recObserver struct {
	outbox.NopObserver
	mu         sync.Mutex
	deliveries []outbox.DeliveryEvent
	attempts   []outbox.AttemptEvent
	sent       []outbox.AttemptEvent
	failed     []outbox.AttemptEvent
}

func (o *recObserver) OnDeliveryUpdated(_ context.Context, e outbox.DeliveryEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deliveries = append(o.deliveries, e)
}

func (o *recObserver) OnAttemptFinished(_ context.Context, e outbox.AttemptEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts = append(o.attempts, e)
}

func (o *recObserver) OnSent(_ context.Context, e outbox.AttemptEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent = append(o.sent, e)
}

func (o *recObserver) OnFailed(_ context.Context, e outbox.AttemptEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed = append(o.failed, e)
}

func (o *recObserver) snapshot() (d []outbox.DeliveryEvent, a, s, f []outbox.AttemptEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append(d, o.deliveries...), append(a, o.attempts...), append(s, o.sent...), append(f, o.failed...)
}

func newSQLiteStore(t *testing.T, clock outbox.Clock) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

// sentMessages enqueues n messages of tenant and records them SENT with
// wamids prefix+i, as the processor would.
func sentMessages(t *testing.T, st *sqlite.Store, tenant, prefix string, n int) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Tenant: tenant, Topic: "whatsapp", Payload: json.RawMessage(templatePayload)}
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claimed, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: n, Owner: "test", Now: now.Add(time.Second), Topics: []string{"whatsapp"}})
	if err != nil {
		t.Fatal(err)
	}
	var sent []outbox.Outcome
	var out []outbox.Message
	for _, m := range claimed {
		if m.Tenant != tenant {
			continue
		}
		wamid := fmt.Sprintf("%s%d", prefix, len(out))
		sent = append(sent, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: wamid, StartedAt: now})
		m.ProviderMessageID = wamid
		out = append(out, m)
	}
	if len(out) != n {
		t.Fatalf("claimed %d of %d", len(out), n)
	}
	if _, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "test", Now: now, Outcomes: sent}); err != nil {
		t.Fatal(err)
	}
	return out
}

func get(t *testing.T, st outbox.Store, tenant, id string) outbox.Message {
	t.Helper()
	m, err := st.MessageGet(context.Background(), outbox.MessageGetParams{Tenant: tenant, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type wireStatus struct {
	ID        string     `json:"id"`
	Status    string     `json:"status"`
	Timestamp string     `json:"timestamp"`
	Recipient string     `json:"recipient_id"`
	Errors    []APIError `json:"errors,omitempty"`
	Pricing   any        `json:"pricing,omitempty"`
	// Callback is biz_opaque_callback_data: the outbox message ID the
	// publisher sent.
	Callback string `json:"biz_opaque_callback_data,omitempty"`
}

func statusBody(pid string, statuses ...wireStatus) []byte {
	v := map[string]any{
		"object": "whatsapp_business_account",
		"entry": []any{map[string]any{"id": "WABA", "changes": []any{map[string]any{"field": "messages", "value": map[string]any{
			"messaging_product": "whatsapp",
			"metadata":          map[string]any{"display_phone_number": "15550783881", "phone_number_id": pid},
			"statuses":          statuses,
		}}}}},
	}
	b, _ := json.Marshal(v)
	return b
}

func st(id, status string, ts int64) wireStatus {
	return wireStatus{ID: id, Status: status, Timestamp: fmt.Sprint(ts), Recipient: "16505551234"}
}

func post(h http.Handler, body []byte, sig string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/whatsapp", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if sig != "" {
		r.Header.Set(SignatureHeader, sig)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type hookBundle struct {
	store *sqlite.Store
	hook  *Webhook
	obs   *recObserver
	state *MemoryState
}

func newHook(t *testing.T, mod func(*WebhookConfig)) hookBundle {
	t.Helper()
	b := hookBundle{store: newSQLiteStore(t, nil), obs: &recObserver{}, state: NewMemoryState(QuotaOptions{})}
	cfg := WebhookConfig{Credentials: testCreds(), Receipts: b.store, Observer: b.obs, Windows: b.state, Dedup: b.state}
	if mod != nil {
		mod(&cfg)
	}
	h, err := NewWebhook(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.hook = h
	return b
}

func TestWebhookVerification(t *testing.T) {
	t.Parallel()
	b := newHook(t, nil)
	mux := http.NewServeMux()
	mux.Handle("/hooks/{tenant}", b.hook)
	mux.Handle("/hooks", b.hook)
	tests := []struct {
		name, url string
		header    string
		code      int
		body      string
	}{
		{"path tenant", "/hooks/org-1?hub.mode=subscribe&hub.verify_token=" + testVerify + "&hub.challenge=1158201444", "", 200, "1158201444"},
		{"query tenant", "/hooks?tenant=org-2&hub.mode=subscribe&hub.verify_token=verify-2&hub.challenge=42", "", 200, "42"},
		{"header tenant", "/hooks?hub.mode=subscribe&hub.verify_token=" + testVerify + "&hub.challenge=7", "org-1", 200, "7"},
		{"other tenant's token", "/hooks/org-2?hub.mode=subscribe&hub.verify_token=" + testVerify + "&hub.challenge=1", "", 403, ""},
		{"wrong token", "/hooks/org-1?hub.mode=subscribe&hub.verify_token=nope&hub.challenge=1", "", 403, ""},
		{"wrong mode", "/hooks/org-1?hub.mode=unsubscribe&hub.verify_token=" + testVerify + "&hub.challenge=1", "", 403, ""},
		{"unknown tenant", "/hooks/org-9?hub.mode=subscribe&hub.verify_token=" + testVerify + "&hub.challenge=1", "", 403, ""},
		{"script challenge", "/hooks/org-1?hub.mode=subscribe&hub.verify_token=" + testVerify + "&hub.challenge=%3Cscript%3E", "", 403, ""},
		{"no challenge", "/hooks/org-1?hub.mode=subscribe&hub.verify_token=" + testVerify, "", 403, ""},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, tt.url, nil)
		if tt.header != "" {
			r.Header.Set("X-Org-Id", tt.header)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != tt.code {
			t.Errorf("%s: status %d, want %d", tt.name, w.Code, tt.code)
			continue
		}
		if tt.code == 200 {
			if w.Body.String() != tt.body {
				t.Errorf("%s: body %q, want the raw challenge %q", tt.name, w.Body.String(), tt.body)
			}
			if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("%s: Content-Type %q", tt.name, ct)
			}
		}
	}
	r := httptest.NewRequest(http.MethodPut, "/hooks", nil)
	w := httptest.NewRecorder()
	b.hook.ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", w.Code)
	}
}

func TestWebhookRejectsAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := newHook(t, func(c *WebhookConfig) { c.MaxBodyBytes = 64 << 10 })
	m := sentMessages(t, b.store, "org-1", "wamid.R", 1)[0]
	good := statusBody(testPhoneID, st(m.ProviderMessageID, "delivered", time.Now().Unix()))
	big := statusBody(testPhoneID, st(m.ProviderMessageID, "delivered", time.Now().Unix()), wireStatus{ID: strings.Repeat("x", 70<<10)})
	bad := []byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"value":{"statuses":[{"id":"` + m.ProviderMessageID + `","status":"delivered"}]}}]`)
	typed := []byte(`{"entry":"not a list"}`)
	tests := []struct {
		name string
		body []byte
		sig  string
		hdr  []string
		code int
	}{
		{"missing signature", good, "", nil, 401},
		{"wrong signature", good, Sign(good, "not-the-secret"), nil, 401},
		{"signed with another tenant's secret", good, Sign(good, "other_secret_456"), nil, 401},
		{"malformed signature", good, "sha256=abc", nil, 401},
		{"signature of another body", good, Sign([]byte("{}"), testSecret), nil, 401},
		{"body over the limit", big, Sign(big, testSecret), nil, 413},
		{"malformed JSON", bad, Sign(bad, testSecret), nil, 400},
		{"wrong JSON types", typed, Sign(typed, testSecret), nil, 400},
		{"X-Org-Id disagrees", good, Sign(good, testSecret), []string{"X-Org-Id", "org-2"}, 403},
	}
	for _, tt := range tests {
		w := post(b.hook, tt.body, tt.sig, tt.hdr...)
		if w.Code != tt.code {
			t.Errorf("%s: status %d, want %d", tt.name, w.Code, tt.code)
		}
		if got := get(t, b.store, "org-1", m.ID); got.Status != outbox.StatusSent {
			t.Fatalf("%s changed the message: %s", tt.name, got.Status)
		}
	}
	if d, _, _, _ := b.obs.snapshot(); len(d) != 0 {
		t.Fatalf("observer saw %d delivery updates from refused requests", len(d))
	}
	// the same body, correctly signed, with the agreeing X-Org-Id is applied
	if w := post(b.hook, good, Sign(good, testSecret), "X-Org-Id", "org-1"); w.Code != 200 {
		t.Fatalf("good request: %d", w.Code)
	}
	if got := get(t, b.store, "org-1", m.ID); got.Status != outbox.StatusDelivered {
		t.Fatalf("status = %s", got.Status)
	}
}

func TestWebhookDefaultBodyLimitIs3MB(t *testing.T) {
	t.Parallel()
	b := newHook(t, nil)
	pad := strings.Repeat("a", 3<<20)
	body := []byte(`{"object":"x","pad":"` + pad + `"}`)
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("%d bytes: status %d, want 413", len(body), w.Code)
	}
	ok := []byte(`{"object":"x","pad":"` + pad[:3<<20-100] + `"}`)
	if w := post(b.hook, ok, Sign(ok, testSecret)); w.Code != 200 {
		t.Fatalf("%d bytes: status %d, want 200", len(ok), w.Code)
	}
}

func TestWebhookEveryStatus(t *testing.T) {
	t.Parallel()
	var events []StatusEvent
	var mu sync.Mutex
	b := newHook(t, func(c *WebhookConfig) {
		c.OnStatus = func(_ context.Context, e StatusEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }
	})
	ms := sentMessages(t, b.store, "org-1", "wamid.S", 2)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	send := func(s ...wireStatus) {
		t.Helper()
		body := statusBody(testPhoneID, s...)
		if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	pricing := map[string]any{"billable": true, "pricing_model": "PMP", "type": "regular", "category": "utility"}
	s0 := st(ms[0].ProviderMessageID, "sent", t0.Unix())
	s0.Pricing = pricing
	send(s0)
	if m := get(t, b.store, "org-1", ms[0].ID); m.Status != outbox.StatusSent {
		t.Fatalf("after sent: %s", m.Status)
	}
	send(st(ms[0].ProviderMessageID, "delivered", t0.Add(time.Minute).Unix()))
	m := get(t, b.store, "org-1", ms[0].ID)
	if m.Status != outbox.StatusDelivered || !m.DeliveredAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after delivered: %s at %v", m.Status, m.DeliveredAt)
	}
	send(st(ms[0].ProviderMessageID, "read", t0.Add(2*time.Minute).Unix()))
	m = get(t, b.store, "org-1", ms[0].ID)
	if m.Status != outbox.StatusDelivered || !m.ReadAt.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("after read: %s read at %v", m.Status, m.ReadAt)
	}
	failed := st(ms[1].ProviderMessageID, "failed", t0.Unix())
	failed.Errors = []APIError{{Code: 131050, Title: "User stopped marketing messages", Message: "User stopped marketing messages"}}
	failed.Errors[0].ErrorData.Details = "The user has opted out"
	send(failed)
	m = get(t, b.store, "org-1", ms[1].ID)
	if m.Status != outbox.StatusFailed || m.LastError == nil || m.LastError.Code != "131050" || !strings.Contains(m.LastError.Message, "opted out") {
		t.Fatalf("after failed: %s %+v", m.Status, m.LastError)
	}
	d, _, _, _ := b.obs.snapshot()
	if len(d) != 3 {
		t.Fatalf("%d delivery events, want 3 (delivered, read, failed; the sent receipt changes nothing)", len(d))
	}
	last := d[2]
	if last.Previous != outbox.StatusSent || last.Message.Status != outbox.StatusFailed || last.Receipt.Status != outbox.DeliveryFailed ||
		last.Message.ID != ms[1].ID || last.Message.ProviderMessageID != ms[1].ProviderMessageID || last.Message.Tenant != "org-1" {
		t.Fatalf("failed event = %+v", last)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 4 || events[0].Status.Pricing == nil || events[0].Status.Pricing.Category != "utility" || !events[0].Found {
		t.Fatalf("OnStatus events = %+v", events)
	}
}

func TestWebhookOutOfOrderAndDuplicates(t *testing.T) {
	t.Parallel()
	b := newHook(t, nil)
	m := sentMessages(t, b.store, "org-1", "wamid.O", 1)[0]
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	id := m.ProviderMessageID
	// read arrives first (delivered skipped), then a late delivered and sent, then duplicates
	for _, s := range []wireStatus{st(id, "read", t0.Add(3*time.Second).Unix()), st(id, "delivered", t0.Add(2*time.Second).Unix()),
		st(id, "sent", t0.Add(time.Second).Unix()), st(id, "read", t0.Add(3*time.Second).Unix()), st(id, "failed", t0.Add(4*time.Second).Unix())} {
		body := statusBody(testPhoneID, s, s) // and twice in the same POST
		if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
			t.Fatalf("%s: %d", s.Status, w.Code)
		}
		if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 { // Meta's redelivery
			t.Fatalf("%s redelivered: %d", s.Status, w.Code)
		}
	}
	got := get(t, b.store, "org-1", m.ID)
	if got.Status != outbox.StatusDelivered || got.ReadAt.IsZero() || got.DeliveredAt.IsZero() {
		t.Fatalf("message = %s delivered %v read %v; a late receipt moved it back", got.Status, got.DeliveredAt, got.ReadAt)
	}
	d, _, _, _ := b.obs.snapshot()
	if len(d) != 1 || d[0].Receipt.Status != outbox.DeliveryRead || d[0].Previous != outbox.StatusSent {
		t.Fatalf("delivery events = %+v, want only the read (late and repeated receipts change nothing)", d)
	}
}

func TestWebhookThousandStatuses(t *testing.T) {
	t.Parallel()
	b := newHook(t, nil)
	ms := sentMessages(t, b.store, "org-1", "wamid.K", 500)
	now := time.Now().Unix()
	var sts []wireStatus
	for _, m := range ms {
		sts = append(sts, st(m.ProviderMessageID, "delivered", now), st(m.ProviderMessageID, "read", now))
	}
	body := statusBody(testPhoneID, sts...)
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
		t.Fatalf("status %d", w.Code)
	}
	counts, err := b.store.MessageCount(context.Background(), outbox.MessageCountParams{Tenant: "org-1"})
	if err != nil {
		t.Fatal(err)
	}
	if counts[outbox.StatusDelivered] != 500 {
		t.Fatalf("counts = %v", counts)
	}
}

func TestWebhookTenantIsolation(t *testing.T) {
	t.Parallel()
	b := newHook(t, nil)
	m1 := sentMessages(t, b.store, "org-1", "wamid.A", 1)[0]
	m2 := sentMessages(t, b.store, "org-2", "wamid.B", 1)[0]
	now := time.Now().Unix()
	// org-1's number and secret, naming org-2's wamid: not found in org-1, acknowledged, nothing changed
	body := statusBody(testPhoneID, st(m2.ProviderMessageID, "failed", now))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
		t.Fatalf("status %d", w.Code)
	}
	if got := get(t, b.store, "org-2", m2.ID); got.Status != outbox.StatusSent {
		t.Fatalf("org-1's webhook changed org-2's message: %s", got.Status)
	}
	// org-2's number signed with org-1's secret: refused
	body = statusBody(testPhoneID2, st(m2.ProviderMessageID, "failed", now))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 401 {
		t.Fatalf("forged for org-2: status %d", w.Code)
	}
	// one POST touching both tenants must satisfy both secrets: they differ, so it is refused
	both := []byte(strings.Replace(string(statusBody(testPhoneID, st(m1.ProviderMessageID, "delivered", now))), `"entry":[`,
		`"entry":[{"id":"W2","changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"`+testPhoneID2+`"},"statuses":[{"id":"`+m2.ProviderMessageID+`","status":"delivered","timestamp":"1"}]}}]},`, 1))
	if w := post(b.hook, both, Sign(both, testSecret)); w.Code != 401 {
		t.Fatalf("two tenants, one secret: status %d", w.Code)
	}
	// org-2's own signature works
	body = statusBody(testPhoneID2, st(m2.ProviderMessageID, "delivered", now))
	if w := post(b.hook, body, Sign(body, "other_secret_456")); w.Code != 200 {
		t.Fatalf("org-2: %d", w.Code)
	}
	if got := get(t, b.store, "org-2", m2.ID); got.Status != outbox.StatusDelivered {
		t.Fatalf("org-2: %s", got.Status)
	}
	if got := get(t, b.store, "org-1", m1.ID); got.Status != outbox.StatusSent {
		t.Fatalf("org-1: %s", got.Status)
	}
}

func TestWebhookSharedAppSecret(t *testing.T) {
	t.Parallel()
	creds := StaticCredentials{"org-1": {PhoneNumberID: testPhoneID, AccessToken: "x"}}
	b := newHook(t, func(c *WebhookConfig) { c.Credentials, c.AppSecret = creds, "one-app-secret" })
	m := sentMessages(t, b.store, "org-1", "wamid.SH", 1)[0]
	body := statusBody(testPhoneID, st(m.ProviderMessageID, "delivered", time.Now().Unix()))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 401 {
		t.Fatalf("wrong secret: %d", w.Code)
	}
	if w := post(b.hook, body, Sign(body, "one-app-secret")); w.Code != 200 {
		t.Fatalf("shared secret: %d", w.Code)
	}
	// with no known tenant, the shared secret still authenticates the request
	unknown := statusBody("999", st("wamid.zzz", "delivered", 1))
	if w := post(b.hook, unknown, Sign(unknown, "nope")); w.Code != 401 {
		t.Fatalf("unknown number, bad signature: %d", w.Code)
	}
	if w := post(b.hook, unknown, Sign(unknown, "one-app-secret")); w.Code != 200 {
		t.Fatalf("unknown number, verified by the shared secret: %d", w.Code)
	}
}

func TestWebhookUnknownWamidAndNumber(t *testing.T) {
	t.Parallel()
	b := newHook(t, nil)
	body := statusBody(testPhoneID, st("wamid.NOPE", "delivered", time.Now().Unix()))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
		t.Fatalf("unknown wamid: %d (Meta would retry for days)", w.Code)
	}
	// A phone number ID no tenant has: no secret can verify the signature
	// (none is shared), so it is not acknowledged as if it were verified.
	body = statusBody("999999", st("wamid.NOPE", "delivered", time.Now().Unix()))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 401 {
		t.Fatalf("unknown phone number id: %d, want 401 (nothing verified it)", w.Code)
	}
}

// TestWebhookReceiptBeforeSentIsRedelivered: Meta's receipt can arrive
// before the processor records SENT (the store has no wamid yet). When its
// biz_opaque_callback_data names a message of the tenant that is PENDING or
// PROCESSING, the webhook answers 503 and changes nothing, so that Meta
// redelivers it; once the SENT outcome is recorded the same receipt applies.
// It never reaches another tenant's message, and a receipt naming no message
// in flight is acknowledged as before.
func TestWebhookReceiptBeforeSentIsRedelivered(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var statusEvents []StatusEvent
	var mu sync.Mutex
	b := newHook(t, func(c *WebhookConfig) {
		c.Logger = logger
		c.OnStatus = func(_ context.Context, e StatusEvent) { mu.Lock(); statusEvents = append(statusEvents, e); mu.Unlock() }
	})
	ctx := context.Background()
	ob := outbox.New[*sql.Tx](b.store, outbox.Options{})
	enq, err := ob.Enqueue(ctx,
		outbox.Message{Tenant: "org-1", Topic: "whatsapp", Group: "g", Payload: json.RawMessage(templatePayload)},
		outbox.Message{Tenant: "org-1", Topic: "whatsapp", Group: "g", Payload: json.RawMessage(templatePayload)},
	)
	if err != nil {
		t.Fatal(err)
	}
	// the processor claims the first message and sends it: PROCESSING, no
	// wamid stored yet; the second is PENDING behind it
	claimed, err := b.store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "proc", Now: time.Now().Add(time.Second), Topics: []string{"whatsapp"}})
	if err != nil || len(claimed) != 1 || claimed[0].ID != enq[0].Message.ID {
		t.Fatalf("claim: %v %+v", err, claimed)
	}
	m, pending := claimed[0], enq[1].Message
	other := sentMessages(t, b.store, "org-1", "wamid.OTHER", 1)[0]

	now := time.Now().Unix()
	early := st("wamid.EARLY", "delivered", now)
	early.Callback = m.ID
	// one POST: the early receipt and a receipt for a recorded message
	body := statusBody(testPhoneID, early, st(other.ProviderMessageID, "delivered", now))
	for i := 0; i < 2; i++ {
		if w := post(b.hook, body, Sign(body, testSecret)); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("receipt before SENT is recorded: %d, want 503 so that Meta redelivers", w.Code)
		}
	}
	got := get(t, b.store, "org-1", m.ID)
	if got.Status != outbox.StatusProcessing || got.ProviderMessageID != "" || !got.DeliveredAt.IsZero() || got.Attempts != m.Attempts {
		t.Fatalf("the early receipt changed the message: %s %q delivered %v attempts %d", got.Status, got.ProviderMessageID, got.DeliveredAt, got.Attempts)
	}
	if got := get(t, b.store, "org-1", other.ID); got.Status != outbox.StatusDelivered {
		t.Fatalf("the other receipt of the POST was not applied: %s", got.Status)
	}
	if !strings.Contains(logs.String(), "level=INFO") || !strings.Contains(logs.String(), "before its send was recorded") || !strings.Contains(logs.String(), m.ID) {
		t.Fatalf("the early receipt was not logged at info:\n%s", logs.String())
	}

	// a PENDING message (not sent yet, or its outcome a retry) also waits
	p := st("wamid.PENDING", "sent", now)
	p.Callback = pending.ID
	body2 := statusBody(testPhoneID, p)
	if w := post(b.hook, body2, Sign(body2, testSecret)); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("receipt for a PENDING message: %d, want 503", w.Code)
	}

	// another tenant's webhook naming org-1's message: not found in org-2,
	// acknowledged, nothing touched
	cross := st("wamid.EARLY", "failed", now)
	cross.Callback = m.ID
	body3 := statusBody(testPhoneID2, cross)
	if w := post(b.hook, body3, Sign(body3, "other_secret_456")); w.Code != http.StatusOK {
		t.Fatalf("org-2 naming org-1's message: %d, want 200", w.Code)
	}
	// unknown or absent callback data: acknowledged as before
	for _, cb := range []string{"", "01NOSUCHMESSAGE0000000000", strings.Repeat("x", 600)} {
		s := st("wamid.UNKNOWN", "delivered", now)
		s.Callback = cb
		body := statusBody(testPhoneID, s)
		if w := post(b.hook, body, Sign(body, testSecret)); w.Code != http.StatusOK {
			t.Fatalf("unknown wamid, callback %.20q: %d, want 200", cb, w.Code)
		}
	}
	if got := get(t, b.store, "org-1", m.ID); got.Status != outbox.StatusProcessing || got.LastError != nil {
		t.Fatalf("message after the other receipts: %s %+v", got.Status, got.LastError)
	}
	d, _, _, _ := b.obs.snapshot()
	if len(d) != 1 || d[0].Message.ID != other.ID {
		t.Fatalf("delivery events = %+v, want only the other message's", d)
	}

	// the processor records SENT with the wamid; Meta's redelivery applies
	if _, err := b.store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "proc", Now: time.Now(),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "wamid.EARLY", StartedAt: time.Now()}}}); err != nil {
		t.Fatal(err)
	}
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != http.StatusOK {
		t.Fatalf("redelivery after SENT: %d, want 200", w.Code)
	}
	got = get(t, b.store, "org-1", m.ID)
	if got.Status != outbox.StatusDelivered || got.DeliveredAt.IsZero() || got.ProviderMessageID != "wamid.EARLY" {
		t.Fatalf("after the redelivery: %s delivered %v wamid %q", got.Status, got.DeliveredAt, got.ProviderMessageID)
	}
	d, _, _, _ = b.obs.snapshot()
	if len(d) != 2 || d[1].Message.ID != m.ID || d[1].Previous != outbox.StatusSent || d[1].Message.Status != outbox.StatusDelivered {
		t.Fatalf("delivery events = %+v", d)
	}
	// a receipt for a wamid the message no longer has (an earlier send of a
	// message now SENT) is acknowledged: the message is not in flight
	stale := st("wamid.STALE", "delivered", now)
	stale.Callback = m.ID
	body4 := statusBody(testPhoneID, stale)
	if w := post(b.hook, body4, Sign(body4, testSecret)); w.Code != http.StatusOK {
		t.Fatalf("stale wamid of a SENT message: %d, want 200", w.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range statusEvents {
		if e.Status.ID == "wamid.EARLY" && e.Tenant == "org-1" && e.Receipt.Status == outbox.DeliveryDelivered && !e.Found {
			t.Fatalf("OnStatus saw the early receipt as not found: it must see it only once applied")
		}
	}
}

type failingReceipts struct{}

func (failingReceipts) MessageApplyReceipt(context.Context, outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return outbox.ReceiptResult{}, errors.New("database is down")
}

func (failingReceipts) MessageGet(context.Context, outbox.MessageGetParams) (outbox.Message, error) {
	return outbox.Message{}, errors.New("database is down")
}

func TestWebhookStoreErrorAnswers5xx(t *testing.T) {
	t.Parallel()
	b := newHook(t, func(c *WebhookConfig) { c.Receipts = failingReceipts{} })
	body := statusBody(testPhoneID, st("wamid.X", "delivered", time.Now().Unix()))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code < 500 {
		t.Fatalf("store error answered %d; Meta must redeliver", w.Code)
	}
}

func inboundBody(pid string, msgs ...string) []byte {
	return []byte(`{"object":"whatsapp_business_account","entry":[{"id":"W","changes":[{"field":"messages","value":{"messaging_product":"whatsapp",
	"metadata":{"display_phone_number":"15550783881","phone_number_id":"` + pid + `"},
	"contacts":[{"profile":{"name":"Sheena Nelson"},"wa_id":"16505551234"}],
	"messages":[` + strings.Join(msgs, ",") + `]}}]}]}`)
}

func inboundMsg(id string, ts int64) string {
	return fmt.Sprintf(`{"from":"16505551234","id":%q,"timestamp":"%d","type":"text","text":{"body":"hi there"}}`, id, ts)
}

func TestWebhookInbound(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []InboundMessage
	failNext := false
	b := newHook(t, func(c *WebhookConfig) {
		c.OnInbound = func(_ context.Context, m InboundMessage) error {
			mu.Lock()
			defer mu.Unlock()
			if failNext {
				failNext = false
				return errors.New("host busy")
			}
			got = append(got, m)
			return nil
		}
	})
	ctx := context.Background()
	ts := time.Now().Add(-time.Minute).Truncate(time.Second)
	body := inboundBody(testPhoneID, inboundMsg("wamid.IN1", ts.Unix()), inboundMsg("wamid.IN1", ts.Unix()))
	for i := 0; i < 2; i++ { // duplicated within the POST and redelivered
		if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
			t.Fatalf("status %d", w.Code)
		}
	}
	mu.Lock()
	if len(got) != 1 {
		t.Fatalf("callback ran %d times, want once", len(got))
	}
	m := got[0]
	mu.Unlock()
	if m.Tenant != "org-1" || m.ID != "wamid.IN1" || m.Phone != testRecipient || m.Text != "hi there" || m.ContactName != "Sheena Nelson" ||
		!m.Timestamp.Equal(ts) || !strings.Contains(string(m.Raw), `"type":"text"`) || m.PhoneNumberID != testPhoneID {
		t.Fatalf("inbound = %+v", m)
	}
	w, ok, err := b.state.WindowGet(ctx, "org-1", testRecipient)
	if err != nil || !ok || !w.LastInboundAt.Equal(ts) {
		t.Fatalf("window not refreshed: %+v %v %v", w, ok, err)
	}
	if _, ok, _ := b.state.WindowGet(ctx, "org-2", testRecipient); ok {
		t.Fatal("another tenant's window opened")
	}
	// a failing callback answers 500 and the redelivery is offered again
	mu.Lock()
	failNext = true
	mu.Unlock()
	body2 := inboundBody(testPhoneID, inboundMsg("wamid.IN2", ts.Unix()))
	if w := post(b.hook, body2, Sign(body2, testSecret)); w.Code != 500 {
		t.Fatalf("failing callback: %d", w.Code)
	}
	if w := post(b.hook, body2, Sign(body2, testSecret)); w.Code != 200 {
		t.Fatalf("redelivery: %d", w.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[1].ID != "wamid.IN2" {
		t.Fatalf("after redelivery: %d messages", len(got))
	}
}

func TestWebhookInsecureOption(t *testing.T) {
	t.Parallel()
	b := newHook(t, func(c *WebhookConfig) { c.InsecureSkipSignature = true })
	m := sentMessages(t, b.store, "org-1", "wamid.I", 1)[0]
	body := statusBody(testPhoneID, st(m.ProviderMessageID, "delivered", time.Now().Unix()))
	if w := post(b.hook, body, ""); w.Code != 200 {
		t.Fatalf("insecure mode: %d", w.Code)
	}
	if got := get(t, b.store, "org-1", m.ID); got.Status != outbox.StatusDelivered {
		t.Fatalf("status = %s", got.Status)
	}
}

func TestNewWebhookValidates(t *testing.T) {
	t.Parallel()
	if _, err := NewWebhook(WebhookConfig{Receipts: failingReceipts{}}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("no credentials: %v", err)
	}
	if _, err := NewWebhook(WebhookConfig{Credentials: testCreds()}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("no receipts: %v", err)
	}
}

func TestWebhookSingleTenantIgnoresUnknownNumbers(t *testing.T) {
	t.Parallel()
	creds := StaticCredentials{"": {PhoneNumberID: testPhoneID, AccessToken: "x", AppSecret: testSecret, VerifyToken: testVerify}}
	b := newHook(t, func(c *WebhookConfig) { c.Credentials = creds })
	m := sentMessages(t, b.store, "", "wamid.ST", 1)[0]
	now := time.Now().Unix()
	// a change for an unknown number must not be applied to the "" tenant
	body := []byte(strings.Replace(string(statusBody(testPhoneID, st("wamid.other", "delivered", now))), `"entry":[`,
		`"entry":[{"id":"W2","changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"999"},"statuses":[{"id":"`+m.ProviderMessageID+`","status":"failed","timestamp":"1"}]}}]},`, 1))
	if w := post(b.hook, body, Sign(body, testSecret)); w.Code != 200 {
		t.Fatalf("status %d", w.Code)
	}
	if got := get(t, b.store, "", m.ID); got.Status != outbox.StatusSent {
		t.Fatalf("a change for an unknown number was applied: %s", got.Status)
	}
	r := httptest.NewRequest(http.MethodGet, "/?hub.mode=subscribe&hub.verify_token="+testVerify+"&hub.challenge=9", nil)
	w := httptest.NewRecorder()
	b.hook.ServeHTTP(w, r)
	if w.Code != 200 || w.Body.String() != "9" {
		t.Fatalf("single-tenant verification: %d %q", w.Code, w.Body)
	}
}
