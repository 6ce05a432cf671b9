package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/examples/messaging-service/fakewa"
	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// The black-box suite: the service over HTTP, its processor publishing to
// the fake Cloud API, the fake posting signed receipts back, on each store.

var backends = []string{"sqlite", "postgres", "mysql"}

type database struct{ store, dsn, schema string }

func newDatabase(t *testing.T, kind string) database {
	t.Helper()
	switch kind {
	case "postgres":
		pg := testbackend.Postgres(t, 2)
		return database{store: "postgres", dsn: pg.DSN, schema: pg.Name}
	case "mysql":
		my := testbackend.MySQL(t, 2)
		return database{store: "mysql", dsn: my.DSN}
	default:
		return database{store: "sqlite", dsn: filepath.Join(t.TempDir(), "svc.db")}
	}
}

const (
	key1 = "test-key-org-1-abcdefghijklmnop"
	key2 = "test-key-org-2-abcdefghijklmnop"
)

var phoneIDs = map[string]string{"org-1": "200000000000001", "org-2": "200000000000002"}

type env struct {
	t       *testing.T
	db      database
	fake    *fakewa.Server
	secrets map[string]string // org -> app secret
	svc     *service.Service
	ts      *httptest.Server
	stop    func() // stops the processor (graceful)
	abandon func() // cancels the processor without waiting for it
	procErr chan error
}

// newEnv starts the fake Cloud API and a service (HTTP + processor) on db.
func newEnv(t *testing.T, db database, fake *fakewa.Server, mod func(*service.Config)) *env {
	t.Helper()
	e := &env{t: t, db: db, secrets: map[string]string{"org-1": "secret-org-1", "org-2": "secret-org-2"}}
	phones := map[string]fakewa.Phone{}
	var orgs []service.Org
	for _, org := range []string{"org-1", "org-2"} {
		p := fakewa.Phone{AccessToken: "token-" + org, AppSecret: e.secrets[org]}
		phones[phoneIDs[org]] = p
		o := service.Org{ID: org, APIKey: map[string]string{"org-1": key1, "org-2": key2}[org]}
		o.WhatsApp.PhoneNumberID, o.WhatsApp.AccessToken, o.WhatsApp.AppSecret = phoneIDs[org], p.AccessToken, p.AppSecret
		o.WhatsApp.VerifyToken = "verify-" + org
		orgs = append(orgs, o)
	}
	if fake == nil {
		var err error
		fake, err = fakewa.Start("127.0.0.1:0", fakewa.Config{Phones: phones, ReceiptDelay: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fake.Close() })
	}
	e.fake = fake
	cfg := service.Config{Store: db.store, DSN: db.dsn, PostgresSchema: db.schema, MaxConns: 4, Orgs: orgs,
		GraphBaseURL: fake.URL(), PollInterval: 200 * time.Millisecond, DrainTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := service.New(ctx, cfg)
	if err != nil {
		t.Fatalf("service.New: %v", err)
	}
	e.svc = svc
	// Every response the suite gets is checked against the OpenAPI
	// document (openapi_validate_test.go).
	conf := newConformance(t)
	t.Cleanup(func() { conf.report(t) })
	e.ts = httptest.NewServer(conf.wrap(svc.Handler()))
	fake.SetWebhookURL(e.ts.URL + service.WebhookPath)
	pctx, pcancel := context.WithCancel(context.Background())
	e.procErr = make(chan error, 1)
	go func() { e.procErr <- svc.RunProcessor(pctx) }()
	var once sync.Once
	e.abandon = func() { once.Do(pcancel) }
	e.stop = func() {
		once.Do(func() {
			pcancel()
			if err := <-e.procErr; err != nil {
				t.Errorf("processor: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		e.stop()
		e.ts.Close()
		_ = svc.Close()
	})
	return e
}

// testWriter sends the service's warnings and errors to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

type resp struct {
	status int
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("response %d %s: %v", r.status, r.body, err)
	}
}

func (r resp) errCode(t *testing.T) string {
	t.Helper()
	var b struct {
		Error struct{ Code, Message string }
	}
	r.json(t, &b)
	if b.Error.Code == "" || b.Error.Message == "" {
		t.Fatalf("error body without code and message: %s", r.body)
	}
	return b.Error.Code
}

// do calls the API as org (its key and X-Org-Id); org "" sends neither.
func (e *env) do(method, path, org string, body any, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, e.ts.URL+path, rd)
	if org != "" {
		req.Header.Set("Authorization", "Bearer "+map[string]string{"org-1": key1, "org-2": key2}[org])
		req.Header.Set("X-Org-Id", org)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, b}
}

type message struct {
	ID, OrgID, Channel, Direction, To, TemplateCode, Status, ProviderMessageID, IdempotencyKey, ErrorCode, ErrorMessage string
	DossierID                                                                                                           int64
	AttemptCount, MaxAttempts                                                                                           int
	CreatedAt, UpdatedAt                                                                                                time.Time
	SentAt, DeliveredAt, ReadAt                                                                                         *time.Time
	LastError                                                                                                           *struct{ Code, Message string }
}

type audit struct {
	EntityType, EntityID, Action, Details, OrgID string
}

type activity struct {
	OutboundMessageID, ActivityType string
	DossierID                       int64
	Metadata                        map[string]any
}

func (e *env) consent(org string, dossier int64, status string) {
	e.t.Helper()
	r := e.do("POST", fmt.Sprintf("/api/v1/dossiers/%d/consents", dossier), org, map[string]string{"channel": "WHATSAPP", "status": status})
	if r.status != http.StatusCreated {
		e.t.Fatalf("consent: %d %s", r.status, r.body)
	}
}

func sendBody(dossier int64, to string) map[string]any {
	return map[string]any{"dossierId": dossier, "channel": "WHATSAPP", "to": to, "templateCode": "order_confirmation",
		"payloadJson": map[string]any{"language": "en", "components": []any{map[string]any{"type": "body",
			"parameters": []any{map[string]string{"type": "text", "text": "John Doe"}}}}}}
}

func (e *env) create(org string, body any, wantStatus int, hdr ...string) message {
	e.t.Helper()
	r := e.do("POST", "/api/v1/outbound/messages", org, body, hdr...)
	if r.status != wantStatus {
		e.t.Fatalf("create: got %d %s, want %d", r.status, r.body, wantStatus)
	}
	var m message
	r.json(e.t, &m)
	return m
}

func (e *env) get(org, id string) message {
	e.t.Helper()
	r := e.do("GET", "/api/v1/outbound/messages/"+id, org, nil)
	if r.status != http.StatusOK {
		e.t.Fatalf("get %s: %d %s", id, r.status, r.body)
	}
	var m message
	r.json(e.t, &m)
	return m
}

// waitFor polls the message until cond holds (or fails after 20 s).
func (e *env) waitFor(org, id string, what string, cond func(message) bool) message {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := e.get(org, id)
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("message %s never became %s; last: %+v", id, what, m)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func (e *env) waitStatus(org, id, status string) message {
	e.t.Helper()
	return e.waitFor(org, id, status, func(m message) bool { return m.Status == status })
}

func (e *env) audits(org, path string) []audit {
	e.t.Helper()
	r := e.do("GET", path, org, nil)
	if r.status != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var out []audit
	r.json(e.t, &out)
	return out
}

func actions(as []audit) string {
	var s []string
	for _, a := range as {
		s = append(s, a.Action)
	}
	return strings.Join(s, ",")
}

func (e *env) activities(org, path string) []activity {
	e.t.Helper()
	r := e.do("GET", path, org, nil)
	if r.status != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var out []activity
	r.json(e.t, &out)
	return out
}

func (e *env) list(org string, dossier int64) []message {
	e.t.Helper()
	r := e.do("GET", fmt.Sprintf("/api/v1/outbound/messages?dossierId=%d", dossier), org, nil)
	if r.status != http.StatusOK {
		e.t.Fatalf("list: %d %s", r.status, r.body)
	}
	var out []message
	r.json(e.t, &out)
	return out
}

// webhook posts a notification signed with secret.
func (e *env) webhook(body []byte, secret string) int {
	e.t.Helper()
	st, err := fakewa.Post(context.Background(), http.DefaultClient, e.ts.URL+service.WebhookPath, body, secret)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func TestService(t *testing.T) {
	t.Parallel()
	for _, kind := range backends {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newDatabase(t, kind), nil, nil)
			// Subtests share the service; each uses its own dossiers and
			// recipients. They run in order (one service per store).
			t.Run("Health", e.testHealth)
			t.Run("Auth", e.testAuth)
			t.Run("CreateValidation", e.testCreateValidation)
			t.Run("Consent", e.testConsent)
			t.Run("Idempotency", e.testIdempotency)
			t.Run("Lifecycle", e.testLifecycle)
			t.Run("Webhook", e.testWebhook)
			t.Run("Retry", e.testRetry)
			t.Run("Listing", e.testListing)
			t.Run("Window", e.testWindow)
			t.Run("CrossOrg", e.testCrossOrg)
			t.Run("Stats", e.testStats)
		})
	}
}

func (e *env) testHealth(t *testing.T) {
	e.t = t
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := e.do("GET", p, "", nil); r.status != 200 {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
	}
	r := e.do("GET", "/api/v1/nope", "org-1", nil)
	if r.status != 404 || r.errCode(t) != "not_found" {
		t.Errorf("unknown path: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/api/v1/outbound/messages/x", "org-1", nil); r.status != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", r.status)
	}
}

func (e *env) testAuth(t *testing.T) {
	e.t = t
	body := sendBody(100, "+33600000100")
	cases := []struct {
		name   string
		hdr    []string
		status int
		code   string
	}{
		{"no key", []string{"Authorization", ""}, 401, "unauthenticated"},
		{"wrong key", []string{"Authorization", "Bearer not-a-key-0123456789"}, 401, "unauthenticated"},
		{"not bearer", []string{"Authorization", "Basic " + key1}, 401, "unauthenticated"},
		{"no org", []string{"X-Org-Id", ""}, 400, "missing_org"},
		{"other org", []string{"X-Org-Id", "org-2"}, 403, "org_mismatch"},
	}
	for _, c := range cases {
		for _, ep := range [][2]string{{"POST", "/api/v1/outbound/messages"}, {"GET", "/api/v1/outbound/stats"}, {"GET", "/api/v1/outbound/messages/x"},
			{"POST", "/api/v1/outbound/messages/x/retry"}, {"GET", "/api/v1/dossiers/1/consents"}} {
			r := e.do(ep[0], ep[1], "org-1", body, c.hdr...)
			if r.status != c.status || r.errCode(t) != c.code {
				t.Errorf("%s %s %s: got %d %s, want %d %s", c.name, ep[0], ep[1], r.status, r.body, c.status, c.code)
			}
		}
	}
	if n := len(e.list("org-1", 100)); n != 0 {
		t.Errorf("refused requests created %d messages", n)
	}
}

func (e *env) testCreateValidation(t *testing.T) {
	e.t = t
	e.consent("org-1", 101, "GRANTED")
	with := func(k string, v any) map[string]any {
		b := sendBody(101, "+33600000101")
		if v == nil {
			delete(b, k)
		} else {
			b[k] = v
		}
		return b
	}
	cases := []struct {
		name   string
		body   any
		hdr    []string
		status int
		code   string
	}{
		{"bad json", `{"dossierId": 101,`, nil, 400, "invalid_json"},
		{"not an object", `[1,2]`, nil, 400, "invalid_json"},
		{"two values", `{} {}`, nil, 400, "invalid_json"},
		{"unknown field", with("colour", "red"), nil, 400, "invalid_json"},
		{"unknown channel", with("channel", "PIGEON"), nil, 400, "invalid_channel"},
		{"no channel", with("channel", nil), nil, 400, "invalid_channel"},
		{"unsupported channel", with("channel", "SMS"), nil, 400, "unsupported_channel"},
		{"no dossier", with("dossierId", nil), nil, 400, "invalid_dossier"},
		{"negative dossier", with("dossierId", -4), nil, 400, "invalid_dossier"},
		{"no recipient", with("to", nil), nil, 400, "invalid_recipient"},
		{"bad recipient", with("to", "call me"), nil, 400, "invalid_recipient"},
		{"payload not object", with("payloadJson", "x"), nil, 400, "invalid_payload"},
		{"text without body", with("templateCode", nil), nil, 400, "invalid_payload"},
		{"keys differ", with("idempotencyKey", "a"), []string{"Idempotency-Key", "b"}, 400, "invalid_idempotency_key"},
		{"key too long", with("idempotencyKey", strings.Repeat("k", 256)), nil, 400, "invalid_idempotency_key"},
		{"oversize", with("payloadJson", map[string]any{"language": "en", "pad": strings.Repeat("x", 300<<10)}), nil, 413, "body_too_large"},
	}
	for _, c := range cases {
		r := e.do("POST", "/api/v1/outbound/messages", "org-1", c.body, c.hdr...)
		if r.status != c.status || r.errCode(t) != c.code {
			t.Errorf("%s: got %d %s, want %d %s", c.name, r.status, r.body, c.status, c.code)
		}
	}
	if n := len(e.list("org-1", 101)); n != 0 {
		t.Errorf("invalid requests created %d messages", n)
	}
	m := e.create("org-1", sendBody(101, "+33 6 00 00 01 01"), 201)
	if m.Status != "QUEUED" && m.Status != "SENDING" || m.OrgID != "org-1" || m.DossierID != 101 || m.Channel != "WHATSAPP" ||
		m.Direction != "OUTBOUND" || m.To != "+33600000101" || m.TemplateCode != "order_confirmation" || m.AttemptCount != 0 ||
		m.MaxAttempts != 5 || m.IdempotencyKey == "" || m.CreatedAt.Location() != time.UTC || m.CreatedAt.IsZero() {
		t.Errorf("created message %+v", m)
	}
}

func (e *env) testConsent(t *testing.T) {
	e.t = t
	const d = 102
	// Absent: refused, audited against the dossier, nothing enqueued.
	r := e.do("POST", "/api/v1/outbound/messages", "org-1", sendBody(d, "+33600000102"))
	if r.status != 422 || r.errCode(t) != "consent_required" {
		t.Fatalf("no consent: %d %s", r.status, r.body)
	}
	as := e.audits("org-1", fmt.Sprintf("/api/v1/dossiers/%d/audit-events", d))
	if actions(as) != "BLOCKED_BY_POLICY" || as[0].EntityType != "DOSSIER" || as[0].EntityID != "102" || !strings.Contains(as[0].Details, "Consent required") {
		t.Errorf("audit after refusal: %+v", as)
	}
	e.consent("org-1", d, "GRANTED")
	m := e.create("org-1", sendBody(d, "+33600000102"), 201)
	e.consent("org-1", d, "REVOKED")
	if r := e.do("POST", "/api/v1/outbound/messages", "org-1", sendBody(d, "+33600000102")); r.status != 422 {
		t.Errorf("revoked: %d %s", r.status, r.body)
	}
	// The repeat of an accepted request is answered from its key, even
	// after the revocation (seed: idempotency before consent).
	e.consent("org-1", d, "GRANTED")
	e.create("org-1", sendBody(d, "+33600000102"), 201)
	if got := e.list("org-1", d); len(got) != 2 {
		t.Errorf("messages of the dossier: %d, want 2", len(got))
	}
	as = e.audits("org-1", fmt.Sprintf("/api/v1/dossiers/%d/audit-events", d))
	if want := "BLOCKED_BY_POLICY,CONSENT_GRANTED,CONSENT_REVOKED,BLOCKED_BY_POLICY,CONSENT_GRANTED"; actions(as) != want {
		t.Errorf("dossier audit %s, want %s", actions(as), want)
	}
	var cs []struct{ Channel, Status string }
	cr := e.do("GET", fmt.Sprintf("/api/v1/dossiers/%d/consents", d), "org-1", nil)
	cr.json(t, &cs)
	if len(cs) != 3 || cs[0].Status != "GRANTED" || cs[1].Status != "REVOKED" {
		t.Errorf("consents %+v", cs)
	}
	// Consent of another channel does not count.
	r = e.do("POST", "/api/v1/dossiers/103/consents", "org-1", map[string]string{"channel": "SMS", "status": "GRANTED"})
	if r.status != 201 {
		t.Fatalf("sms consent: %d", r.status)
	}
	if r := e.do("POST", "/api/v1/outbound/messages", "org-1", sendBody(103, "+33600000103")); r.status != 422 {
		t.Errorf("consent for SMS only: %d %s", r.status, r.body)
	}
	for _, bad := range []any{`{"channel":"WHATSAPP"}`, map[string]string{"channel": "FAX", "status": "GRANTED"}, `nope`} {
		if r := e.do("POST", "/api/v1/dossiers/103/consents", "org-1", bad); r.status != 400 {
			t.Errorf("bad consent %v: %d", bad, r.status)
		}
	}
	if r := e.do("POST", "/api/v1/dossiers/abc/consents", "org-1", map[string]string{"channel": "SMS", "status": "GRANTED"}); r.status != 400 {
		t.Errorf("bad dossier: %d", r.status)
	}
	_ = m
}

func (e *env) testIdempotency(t *testing.T) {
	e.t = t
	const d = 104
	e.consent("org-1", d, "GRANTED")
	const n = 50
	var wg sync.WaitGroup
	res := make([]resp, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", e.ts.URL+"/api/v1/outbound/messages", strings.NewReader(
				`{"dossierId":104,"channel":"WHATSAPP","to":"+33600000104","templateCode":"t","payloadJson":{"language":"en"}}`))
			req.Header.Set("Authorization", "Bearer "+key1)
			req.Header.Set("X-Org-Id", "org-1")
			req.Header.Set("Idempotency-Key", "same-key-104")
			r, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(r.Body)
			_ = r.Body.Close()
			res[i] = resp{r.StatusCode, b}
		}()
	}
	wg.Wait()
	created, ids := 0, map[string]bool{}
	for _, r := range res {
		switch r.status {
		case 201:
			created++
		case 200:
		default:
			t.Fatalf("concurrent create: %d %s", r.status, r.body)
		}
		var m message
		r.json(t, &m)
		ids[m.ID] = true
	}
	if created != 1 || len(ids) != 1 {
		t.Fatalf("50 identical requests: %d created, %d distinct ids", created, len(ids))
	}
	if got := e.list("org-1", d); len(got) != 1 {
		t.Fatalf("messages: %d", len(got))
	}
	var id string
	for k := range ids {
		id = k
	}
	if as := e.audits("org-1", "/api/v1/outbound/messages/"+id+"/audit-events"); len(as) == 0 || as[0].Action != "CREATED" || strings.Count(actions(as), "CREATED") != 1 {
		t.Errorf("audit of the idempotent message: %s", actions(as))
	}
	// The key in the body works like the header; the answer is the original.
	b := sendBody(d, "+33600000104")
	b["idempotencyKey"] = "same-key-104"
	if m := e.create("org-1", b, 200); m.ID != id {
		t.Errorf("body key returned %s, want %s", m.ID, id)
	}
	e.waitStatus("org-1", id, "DELIVERED")
	if sends := countSends(e.fake, id); sends != 1 {
		t.Errorf("the fake received %d sends of the message", sends)
	}
}

func countSends(f *fakewa.Server, id string) int {
	n := 0
	for _, s := range f.Sends() {
		if s.CallbackData == id {
			n++
		}
	}
	return n
}

func (e *env) testLifecycle(t *testing.T) {
	e.t = t
	const d = 105
	e.consent("org-1", d, "GRANTED")
	m := e.create("org-1", sendBody(d, "+33600000105"), 201)
	got := e.waitFor("org-1", m.ID, "DELIVERED and read", func(m message) bool { return m.Status == "DELIVERED" && m.ReadAt != nil })
	if !strings.HasPrefix(got.ProviderMessageID, "wamid.") || got.AttemptCount != 1 || got.SentAt == nil || got.DeliveredAt == nil ||
		got.ErrorCode != "" || got.UpdatedAt.Before(got.CreatedAt.Truncate(time.Second)) {
		t.Errorf("delivered message %+v", got)
	}
	as := e.audits("org-1", "/api/v1/outbound/messages/"+m.ID+"/audit-events")
	if actions(as) != "CREATED,SENT,UPDATED,UPDATED" || as[2].Details != "Delivery status updated to: delivered" ||
		as[3].Details != "Delivery status updated to: read" || as[1].Details != "Message sent successfully" ||
		!strings.Contains(as[0].Details, "channel=WHATSAPP, to=+33600000105, template=order_confirmation") {
		t.Errorf("audit trail %+v", as)
	}
	acts := e.activities("org-1", fmt.Sprintf("/api/v1/dossiers/%d/activities", d))
	if len(acts) != 3 || acts[0].ActivityType != "MESSAGE_SENT" || acts[1].ActivityType != "MESSAGE_STATUS_UPDATE" ||
		acts[0].Metadata["outboundMessageId"] != m.ID || acts[0].Metadata["to"] != "+33600000105" || acts[0].Metadata["status"] != "SENT" ||
		acts[1].Metadata["status"] != "delivered" || acts[2].Metadata["status"] != "read" || acts[1].Metadata["providerMessageId"] != got.ProviderMessageID {
		t.Errorf("activities %+v", acts)
	}
	if acts2 := e.activities("org-1", "/api/v1/outbound/messages/"+m.ID+"/activities"); len(acts2) != 3 {
		t.Errorf("message activities: %d", len(acts2))
	}
	// A replayed receipt changes nothing (no new audit row).
	body := fakewa.StatusNotification(phoneIDs["org-1"], got.ProviderMessageID, "delivered", "33600000105", m.ID, time.Now())
	if st := e.webhook(body, e.secrets["org-1"]); st != 200 {
		t.Errorf("replayed receipt: %d", st)
	}
	if as := e.audits("org-1", "/api/v1/outbound/messages/"+m.ID+"/audit-events"); len(as) != 4 {
		t.Errorf("replay added audit rows: %s", actions(as))
	}
}

func (e *env) testWebhook(t *testing.T) {
	e.t = t
	const d = 106
	e.consent("org-1", d, "GRANTED")
	e.fake.FailRecipient("+33600000106", 0)
	release := e.fake.Hold() // keep the receipts away: the message stays SENT...
	m := e.create("org-1", sendBody(d, "+33600000106"), 201)
	release()
	got := e.waitStatus("org-1", m.ID, "DELIVERED")
	wamid := got.ProviderMessageID
	// Another organisation's (validly signed) notification naming this
	// wamid is not applied to org-1's message.
	other := fakewa.StatusNotification(phoneIDs["org-2"], wamid, "failed", "33600000106", m.ID, time.Now())
	if st := e.webhook(other, e.secrets["org-2"]); st != 200 {
		t.Errorf("other org's receipt: %d", st)
	}
	// Forged: org-1's phone number, signed with the wrong secret; unsigned.
	forged := fakewa.StatusNotification(phoneIDs["org-1"], wamid, "failed", "33600000106", m.ID, time.Now())
	if st := e.webhook(forged, e.secrets["org-2"]); st != 401 {
		t.Errorf("forged signature: %d, want 401", st)
	}
	req, _ := http.NewRequest("POST", e.ts.URL+service.WebhookPath, bytes.NewReader(forged))
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != 401 {
		t.Errorf("unsigned: %v %v", r, err)
	} else {
		_ = r.Body.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if after := e.get("org-1", m.ID); after.Status != "DELIVERED" || after.ErrorCode != "" {
		t.Errorf("after foreign and forged receipts: %+v", after)
	}
	// Meta's GET verification with the organisation's verify token.
	r := e.do("GET", service.WebhookPath+"?hub.mode=subscribe&hub.verify_token=wrong&hub.challenge=123", "", nil, "X-Org-Id", "org-1")
	if r.status != 403 {
		t.Errorf("verification with a wrong token: %d", r.status)
	}
	r = e.do("GET", service.WebhookPath+"?hub.mode=subscribe&hub.verify_token=verify-org-1&hub.challenge=1158201444", "", nil, "X-Org-Id", "org-1")
	if r.status != 200 || string(r.body) != "1158201444" {
		t.Errorf("verification: %d %q", r.status, r.body)
	}
}

func (e *env) testRetry(t *testing.T) {
	e.t = t
	const d = 107
	e.consent("org-1", d, "GRANTED")
	to := "+33600000107"
	e.fake.FailRecipient(to, 131026) // undeliverable: permanent
	m := e.create("org-1", sendBody(d, to), 201)
	failed := e.waitStatus("org-1", m.ID, "FAILED")
	if failed.ErrorCode != "131026" || failed.AttemptCount != 1 || failed.ErrorMessage == "" ||
		failed.LastError == nil || failed.LastError.Code != "131026" {
		t.Errorf("failed message %+v", failed)
	}
	acts := e.activities("org-1", "/api/v1/outbound/messages/"+m.ID+"/activities")
	if len(acts) != 1 || acts[0].ActivityType != "MESSAGE_FAILED" || acts[0].Metadata["errorCode"] != "131026" {
		t.Errorf("activities %+v", acts)
	}
	// Other statuses and unknown or foreign IDs.
	other := e.create("org-1", sendBody(d, "+33600000117"), 201)
	e.waitStatus("org-1", other.ID, "DELIVERED")
	if r := e.do("POST", "/api/v1/outbound/messages/"+other.ID+"/retry", "org-1", nil); r.status != 409 || r.errCode(t) != "invalid_status" {
		t.Errorf("retry DELIVERED: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/api/v1/outbound/messages/nope/retry", "org-1", nil); r.status != 404 {
		t.Errorf("retry unknown: %d", r.status)
	}
	if r := e.do("POST", "/api/v1/outbound/messages/"+m.ID+"/retry", "org-2", nil); r.status != 404 {
		t.Errorf("retry by org-2: %d", r.status)
	}
	e.fake.FailRecipient(to, 0)
	r := e.do("POST", "/api/v1/outbound/messages/"+m.ID+"/retry", "org-1", nil)
	var rm message
	r.json(t, &rm)
	if r.status != 200 || rm.Status != "QUEUED" && rm.Status != "SENDING" && rm.Status != "SENT" {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	start := time.Now()
	got := e.waitFor("org-1", m.ID, "read", func(m message) bool { return m.ReadAt != nil })
	if time.Since(start) > 10*time.Second || got.AttemptCount != 1 {
		t.Errorf("after retry %+v (took %s)", got, time.Since(start))
	}
	if a := actions(e.audits("org-1", "/api/v1/outbound/messages/"+m.ID+"/audit-events")); a != "CREATED,FAILED,REQUEUED,SENT,UPDATED,UPDATED" {
		t.Errorf("audit %s", a)
	}
}

func (e *env) testListing(t *testing.T) {
	e.t = t
	const d = 108
	e.consent("org-1", d, "GRANTED")
	var ids []string
	for i := range 3 {
		ids = append(ids, e.create("org-1", sendBody(d, fmt.Sprintf("+3360000018%d", i)), 201).ID)
		time.Sleep(2 * time.Millisecond)
	}
	list := e.list("org-1", d)
	if len(list) != 3 || list[0].ID != ids[2] || list[2].ID != ids[0] {
		t.Errorf("list newest first: %v", list)
	}
	type page struct {
		Content                               []message
		Page, Size, TotalElements, TotalPages int
		Sort, Direction                       string
	}
	var p page
	r := e.do("GET", fmt.Sprintf("/api/v1/outbound/messages/paginated?dossierId=%d&page=0&size=2&sort=createdAt&direction=ASC", d), "org-1", nil)
	r.json(t, &p)
	if r.status != 200 || len(p.Content) != 2 || p.Content[0].ID != ids[0] || p.TotalElements != 3 || p.TotalPages != 2 || p.Direction != "ASC" {
		t.Errorf("page 0: %d %+v", r.status, p)
	}
	r = e.do("GET", fmt.Sprintf("/api/v1/outbound/messages/paginated?dossierId=%d&page=1&size=2&sort=createdAt&direction=asc", d), "org-1", nil)
	r.json(t, &p)
	if len(p.Content) != 1 || p.Content[0].ID != ids[2] {
		t.Errorf("page 1: %+v", p)
	}
	r = e.do("GET", fmt.Sprintf("/api/v1/outbound/messages/paginated?dossierId=%d&sort=to&direction=DESC", d), "org-1", nil)
	r.json(t, &p)
	if len(p.Content) != 3 || p.Content[0].To != "+33600000182" || p.Size != 20 {
		t.Errorf("sort by to: %+v", p)
	}
	for q, code := range map[string]string{
		"dossierId=108&sort=status":  "invalid_sort",
		"dossierId=108&size=101":     "invalid_size",
		"dossierId=108&size=0":       "invalid_size",
		"dossierId=108&page=-1":      "invalid_page",
		"dossierId=108&page=x":       "invalid_page",
		"dossierId=108&direction=UP": "invalid_direction",
		"page=0":                     "invalid_dossier",
		"dossierId=-1":               "invalid_dossier",
	} {
		if r := e.do("GET", "/api/v1/outbound/messages/paginated?"+q, "org-1", nil); r.status != 400 || r.errCode(t) != code {
			t.Errorf("%s: %d %s, want 400 %s", q, r.status, r.body, code)
		}
	}
	for _, q := range []string{"", "dossierId=abc"} {
		if r := e.do("GET", "/api/v1/outbound/messages?"+q, "org-1", nil); r.status != 400 {
			t.Errorf("list %q: %d", q, r.status)
		}
	}
	if r := e.do("GET", "/api/v1/outbound/messages/"+strings.Repeat("x", 300), "org-1", nil); r.status != 404 {
		t.Errorf("long id: %d", r.status)
	}
}

func (e *env) testWindow(t *testing.T) {
	e.t = t
	const d = 109
	e.consent("org-1", d, "GRANTED")
	// A recipient of this run only (window state may outlive it in Redis).
	to := fmt.Sprintf("+336%08d", time.Now().UnixNano()%100000000)
	text := map[string]any{"dossierId": d, "channel": "WHATSAPP", "to": to, "payloadJson": map[string]any{"body": "Your order shipped"}}
	m := e.create("org-1", text, 201)
	if got := e.waitStatus("org-1", m.ID, "FAILED"); got.ErrorCode == "" {
		t.Errorf("free-form outside the window: %+v", got)
	}
	// The user writes: the 24-hour window opens and free-form text goes.
	in := fakewa.InboundNotification(phoneIDs["org-1"], to[1:], "wamid.IN"+to[1:], "hello", time.Now())
	if st := e.webhook(in, e.secrets["org-1"]); st != 200 {
		t.Fatalf("inbound: %d", st)
	}
	m2 := e.create("org-1", text, 201)
	e.waitStatus("org-1", m2.ID, "DELIVERED")
}

// TestRedisState runs the window and lifecycle tests with 24-hour windows,
// quotas and inbound de-duplication in Redis (-redis).
func TestRedisState(t *testing.T) {
	t.Parallel()
	addr := testbackend.RedisAddr(t)
	_, prefix := testbackend.Redis(t) // keys under prefix are deleted at the end
	e := newEnv(t, newDatabase(t, "sqlite"), nil, func(c *service.Config) {
		c.RedisAddr = addr
		c.RedisPrefix = prefix
	})
	t.Run("Window", e.testWindow)
	t.Run("Lifecycle", e.testLifecycle)
}

func (e *env) testCrossOrg(t *testing.T) {
	e.t = t
	const d = 110
	e.consent("org-1", d, "GRANTED")
	m := e.create("org-1", sendBody(d, "+33600000110"), 201, "Idempotency-Key", "shared-key")
	for _, ep := range [][2]string{
		{"GET", "/api/v1/outbound/messages/" + m.ID},
		{"POST", "/api/v1/outbound/messages/" + m.ID + "/retry"},
		{"GET", "/api/v1/outbound/messages/" + m.ID + "/audit-events"},
		{"GET", "/api/v1/outbound/messages/" + m.ID + "/activities"},
	} {
		if r := e.do(ep[0], ep[1], "org-2", nil); r.status != 404 || r.errCode(t) != "not_found" {
			t.Errorf("org-2 %s %s: %d %s", ep[0], ep[1], r.status, r.body)
		}
	}
	for _, p := range []string{
		fmt.Sprintf("/api/v1/outbound/messages?dossierId=%d", d),
		fmt.Sprintf("/api/v1/dossiers/%d/audit-events", d),
		fmt.Sprintf("/api/v1/dossiers/%d/activities", d),
		fmt.Sprintf("/api/v1/dossiers/%d/consents", d),
	} {
		if r := e.do("GET", p, "org-2", nil); r.status != 200 || string(bytes.TrimSpace(r.body)) != "[]" {
			t.Errorf("org-2 GET %s: %d %s", p, r.status, r.body)
		}
	}
	r := e.do("GET", fmt.Sprintf("/api/v1/outbound/messages/paginated?dossierId=%d", d), "org-2", nil)
	if !strings.Contains(string(r.body), `"totalElements":0`) {
		t.Errorf("org-2 paginated: %s", r.body)
	}
	// org-1's consent does not cover org-2's dossier of the same number,
	// and org-1's idempotency key does not return org-1's message.
	if r := e.do("POST", "/api/v1/outbound/messages", "org-2", sendBody(d, "+33600000110"), "Idempotency-Key", "shared-key"); r.status != 422 {
		t.Errorf("org-2 without consent: %d %s", r.status, r.body)
	}
	e.consent("org-2", d, "GRANTED")
	m2 := e.create("org-2", sendBody(d, "+33600000110"), 201, "Idempotency-Key", "shared-key")
	if m2.ID == m.ID || m2.OrgID != "org-2" {
		t.Errorf("org-2's message %+v", m2)
	}
	e.waitStatus("org-2", m2.ID, "DELIVERED")
	e.waitStatus("org-1", m.ID, "DELIVERED")
	if as := e.audits("org-2", fmt.Sprintf("/api/v1/dossiers/%d/audit-events", d)); actions(as) != "BLOCKED_BY_POLICY,CONSENT_GRANTED" || as[0].OrgID != "org-2" {
		t.Errorf("org-2 dossier audit %+v", as)
	}
}

func (e *env) testStats(t *testing.T) {
	e.t = t
	type stats struct {
		OrgID                string
		CountsByStatus       map[string]int
		FailedByAttemptCount []struct{ AttemptCount, Count int }
	}
	var s1, s2 stats
	e.do("GET", "/api/v1/outbound/stats", "org-1", nil).json(t, &s1)
	e.do("GET", "/api/v1/outbound/stats", "org-2", nil).json(t, &s2)
	// org-1's window test left one FAILED message (1 attempt).
	if s1.OrgID != "org-1" || s1.CountsByStatus["FAILED"] != 1 || len(s1.FailedByAttemptCount) != 1 ||
		s1.FailedByAttemptCount[0].AttemptCount != 1 || s1.CountsByStatus["DELIVERED"] < 5 {
		t.Errorf("org-1 stats %+v", s1)
	}
	if s2.CountsByStatus["DELIVERED"] != 1 || s2.CountsByStatus["FAILED"] != 0 || len(s2.CountsByStatus) != 6 {
		t.Errorf("org-2 stats %+v", s2)
	}
}

// TestProcessorKilled: a processor dies while a send is in flight (its
// database handle goes away, so it can record nothing); a new process on the
// same database recovers the lease and the message is delivered once.
func TestProcessorKilled(t *testing.T) {
	t.Parallel()
	for _, kind := range backends {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			db := newDatabase(t, kind)
			a := newEnv(t, db, nil, func(c *service.Config) {
				c.DrainTimeout = 10 * time.Millisecond
				c.Logger = slog.New(slog.DiscardHandler) // it logs after the test ends
			})
			a.consent("org-1", 200, "GRANTED")
			release := a.fake.Hold()
			defer release()
			m := a.create("org-1", sendBody(200, "+33600000200"), 201)
			a.waitStatus("org-1", m.ID, "SENDING")
			// Kill: the database goes first, then the processor stops; its
			// in-flight send is cut off and its outcome cannot be written.
			// (The dead processor keeps trying to record its outcome for up
			// to a minute, in the background; it cannot.)
			_ = a.svc.Close()
			a.abandon()
			a.ts.Close()
			time.Sleep(300 * time.Millisecond) // its send is cut off (DrainTimeout)
			release()

			b := newEnv(t, db, a.fake, func(c *service.Config) {
				c.ProcessingTimeout = time.Second
				c.DrainTimeout = 500 * time.Millisecond // inside the lease
				c.RecoveryInterval = 100 * time.Millisecond
			})
			got := b.waitFor("org-1", m.ID, "DELIVERED and read", func(m message) bool { return m.Status == "DELIVERED" && m.ReadAt != nil })
			if got.AttemptCount < 1 || got.ProviderMessageID == "" {
				t.Errorf("after recovery %+v", got)
			}
			if l := b.list("org-1", 200); len(l) != 1 {
				t.Errorf("messages: %d", len(l))
			}
			// At least once: the dead processor's cut-off send may or may not
			// have reached the provider; the message is sent again.
			if n := countSends(b.fake, m.ID); n < 1 || n > 2 {
				t.Errorf("the fake accepted %d sends", n)
			}
			if a := actions(b.audits("org-1", "/api/v1/outbound/messages/"+m.ID+"/audit-events")); a != "CREATED,SENT,UPDATED,UPDATED" {
				t.Errorf("audit %s", a)
			}
		})
	}
}
