package service_test

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/examples/messaging-service/fakewa"
	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
	"github.com/outboxkit/outboxkit/whatsapp"
)

// TestOperations: what a team running the service relies on beyond the
// seed's API, on each store, over HTTP: errors cleared once a message is
// sent, the attempt history, the subject, each organisation's own webhook
// URL, the metrics, bad input refused, an operator's cancel audited, and a
// deployment's own error classes. The service retries after 300 ms (not a
// minute) so that a retry is seen within the test.
func TestOperations(t *testing.T) {
	t.Parallel()
	for _, kind := range backends {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newDatabase(t, kind), nil, func(c *service.Config) {
				c.Backoff = []time.Duration{300 * time.Millisecond}
				c.AdminToken = adminToken
				c.ErrorClasses = map[int]whatsapp.ErrorClass{133004: whatsapp.ClassPermanent}
			})
			t.Run("ErrorClearedOnceSent", e.testErrorClearedOnceSent)
			t.Run("Attempts", e.testAttempts)
			t.Run("Subject", e.testSubject)
			t.Run("OrgWebhookURL", e.testOrgWebhookURL)
			t.Run("Metrics", e.testMetrics)
			t.Run("InvalidUTF8", e.testInvalidUTF8)
			t.Run("UnknownPhoneNumberID", e.testUnknownPhoneNumberID)
			t.Run("CancelAudited", e.testCancelAudited)
			t.Run("ErrorClassOverride", e.testErrorClassOverride)
			t.Run("GeneratedClient", e.testGeneratedClient)
		})
	}
}

// failOnce makes the fake answer code to `to` until the message shows it,
// then lets it through.
func (e *env) failOnce(org, id, to string, code int) message {
	e.t.Helper()
	m := e.waitFor(org, id, "error "+strconv.Itoa(code), func(m message) bool { return m.ErrorCode == strconv.Itoa(code) })
	e.fake.FailRecipient(to, 0)
	return m
}

func (e *env) testErrorClearedOnceSent(t *testing.T) {
	e.t = t
	const d = 301
	e.consent("org-1", d, "GRANTED")
	// A retried attempt (131000, attempt counted), then success.
	to := "+33600000301"
	e.fake.FailRecipient(to, 131000)
	m := e.create("org-1", sendBody(d, to), 201)
	queued := e.failOnce("org-1", m.ID, to, 131000)
	if queued.Status != "QUEUED" && queued.Status != "SENDING" {
		t.Errorf("after a retryable error: %+v", queued)
	}
	got := e.waitStatus("org-1", m.ID, "DELIVERED")
	if got.AttemptCount != 2 || got.ErrorCode != "" || got.ErrorMessage != "" || got.LastError != nil {
		t.Errorf("DELIVERED after a retry still shows an error: %+v", got)
	}
	// A deferral (131056, the pair rate limit: no attempt counted).
	to = "+33600000302"
	e.fake.FailRecipient(to, 131056)
	m = e.create("org-1", sendBody(d, to), 201)
	e.failOnce("org-1", m.ID, to, 131056)
	got = e.waitStatus("org-1", m.ID, "DELIVERED")
	if got.ErrorCode != "" || got.ErrorMessage != "" || got.LastError != nil {
		t.Errorf("DELIVERED after a deferral still shows an error: %+v", got)
	}
}

type attempt struct {
	AttemptNo                       int
	Status, ErrorCode, ErrorMessage string
	ProviderResponse                map[string]any
	NextRetryAt                     *time.Time
	CreatedAt, UpdatedAt            time.Time
}

func (e *env) testAttempts(t *testing.T) {
	e.t = t
	const d = 302
	e.consent("org-1", d, "GRANTED")
	to := "+33600000303"
	e.fake.FailRecipient(to, 131000)
	m := e.create("org-1", sendBody(d, to), 201)
	e.failOnce("org-1", m.ID, to, 131000)
	got := e.waitStatus("org-1", m.ID, "DELIVERED")
	r := e.do("GET", "/api/v1/outbound/messages/"+m.ID+"/attempts", "org-1", nil)
	var as []attempt
	r.json(t, &as)
	if r.status != 200 || len(as) != 2 {
		t.Fatalf("attempts: %d %s", r.status, r.body)
	}
	a1, a2 := as[0], as[1]
	if a1.AttemptNo != 1 || a1.Status != "FAILED" || a1.ErrorCode != "131000" || a1.ErrorMessage == "" || a1.NextRetryAt == nil ||
		a1.NextRetryAt.Before(a1.UpdatedAt.Add(200*time.Millisecond)) || a1.ProviderResponse["error"] == nil {
		t.Errorf("first attempt %+v", a1)
	}
	msgs, _ := a2.ProviderResponse["messages"].([]any)
	if a2.AttemptNo != 2 || a2.Status != "SUCCESS" || a2.ErrorCode != "" || a2.NextRetryAt != nil || len(msgs) != 1 ||
		!strings.Contains(string(r.body), got.ProviderMessageID) || a2.CreatedAt.Before(a1.CreatedAt) {
		t.Errorf("second attempt %+v", a2)
	}
	if r := e.do("GET", "/api/v1/outbound/messages/"+m.ID+"/attempts", "org-2", nil); r.status != 404 || r.errCode(t) != "not_found" {
		t.Errorf("org-2 reads org-1's attempts: %d %s", r.status, r.body)
	}
	fresh := e.create("org-1", sendBody(d, "+33600000304"), 201)
	if r := e.do("GET", "/api/v1/outbound/messages/"+fresh.ID+"/attempts", "org-1", nil); r.status != 200 {
		t.Errorf("attempts of a new message: %d %s", r.status, r.body)
	}
}

func (e *env) testSubject(t *testing.T) {
	e.t = t
	const d = 303
	e.consent("org-1", d, "GRANTED")
	b := sendBody(d, "+33600000305")
	b["subject"] = "Votre commande n° 42"
	m := e.create("org-1", b, 201)
	var got struct{ Subject string }
	e.do("GET", "/api/v1/outbound/messages/"+m.ID, "org-1", nil).json(t, &got)
	if got.Subject != "Votre commande n° 42" {
		t.Errorf("subject stored and returned: %q", got.Subject)
	}
	b["subject"] = strings.Repeat("s", 256)
	if r := e.do("POST", "/api/v1/outbound/messages", "org-1", b); r.status != 400 || r.errCode(t) != "invalid_subject" {
		t.Errorf("subject of 256 characters: %d %s", r.status, r.body)
	}
}

func (e *env) testOrgWebhookURL(t *testing.T) {
	e.t = t
	// Meta's GET as Meta sends it: the URL given to Meta, no header.
	get := func(org, token string) resp {
		q := url.Values{"hub.mode": {"subscribe"}, "hub.verify_token": {token}, "hub.challenge": {"1158201444"}}
		return e.do("GET", service.OrgWebhookPath(org)+"?"+q.Encode(), "", nil)
	}
	if r := get("org-1", "verify-org-1"); r.status != 200 || string(r.body) != "1158201444" {
		t.Errorf("org-1's callback URL: %d %q", r.status, r.body)
	}
	if r := get("org-2", "verify-org-1"); r.status != 403 {
		t.Errorf("org-2's URL with org-1's token: %d", r.status)
	}
	if r := get("org-9", "verify-org-1"); r.status != 403 {
		t.Errorf("unknown organisation: %d", r.status)
	}
	// Notifications on an organisation's URL: its own only.
	body := fakewa.StatusNotification(phoneIDs["org-1"], "wamid.NOTOURS", "delivered", "33600000306", "", time.Now())
	post := func(org string) int {
		st, err := fakewa.Post(t.Context(), http.DefaultClient, e.ts.URL+service.OrgWebhookPath(org), body, e.secrets["org-1"])
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := post("org-1"); st != 200 {
		t.Errorf("org-1's notification on org-1's URL: %d", st)
	}
	if st := post("org-2"); st != 403 {
		t.Errorf("org-1's notification on org-2's URL: %d, want 403", st)
	}
}

func (e *env) testMetrics(t *testing.T) {
	e.t = t
	const d = 304
	e.consent("org-1", d, "GRANTED")
	m := e.create("org-1", sendBody(d, "+33600000307"), 201)
	e.waitStatus("org-1", m.ID, "DELIVERED")
	r := e.do("GET", service.MetricsPath, "", nil)
	if r.status != 200 {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	series := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q", line)
		}
		series[line[:i]] = v
	}
	find := func(prefix string, labels ...string) (float64, bool) {
	next:
		for k, v := range series {
			if !strings.HasPrefix(k, prefix+"{") && k != prefix {
				continue
			}
			for _, l := range labels {
				if !strings.Contains(k, l) {
					continue next
				}
			}
			return v, true
		}
		return 0, false
	}
	for _, want := range []struct {
		name   string
		labels []string
		min    float64
	}{
		{"outbound_message_send_success_total", []string{`topic="whatsapp"`}, 1},
		{"outbound_message_enqueued_total", []string{`topic="whatsapp"`}, 1},
		{"outbound_message_receipts_total", []string{`status="DELIVERED"`}, 1},
		{"outbound_message_queue_depth", []string{`status="DELIVERED"`}, 1},
		{"outbound_message_queue_depth", []string{`status="PENDING"`}, 0},
		{"outbound_message_delivery_latency_seconds_count", []string{`topic="whatsapp"`}, 1},
		{"http_server_request_duration_seconds_count", []string{`http_request_method="POST"`, `http_response_status_code="201"`}, 1},
		{"go_goroutines", nil, 1},
	} {
		if v, ok := find(want.name, want.labels...); !ok || v < want.min {
			t.Errorf("metric %s%v: %v (found %v), want at least %v", want.name, want.labels, v, ok, want.min)
		}
	}
	if _, ok := find("outbound_message_oldest_pending_age_seconds"); !ok {
		// Reported per topic with PENDING messages: make one wait.
		t.Logf("no oldest pending age without pending messages (as designed)")
	}
	if strings.Contains(string(r.body), "org-1") {
		t.Errorf("the metrics name a tenant (unbounded labels)")
	}
}

func (e *env) testInvalidUTF8(t *testing.T) {
	e.t = t
	const d = 305
	e.consent("org-1", d, "GRANTED")
	body := []byte(`{"dossierId":305,"channel":"WHATSAPP","to":"+33600000308","templateCode":"hello` + "\xff\xfe" + `","payloadJson":{"language":"en"}}`)
	if r := e.do("POST", "/api/v1/outbound/messages", "org-1", body); r.status != 400 || r.errCode(t) != "invalid_json" {
		t.Errorf("invalid UTF-8: %d %s, want 400 invalid_json", r.status, r.body)
	}
	if n := len(e.list("org-1", d)); n != 0 {
		t.Errorf("invalid UTF-8 stored %d messages", n)
	}
	// A consent body too.
	if r := e.do("POST", "/api/v1/dossiers/305/consents", "org-1", []byte(`{"channel":"WHATSAPP\xff","status":"GRANTED"}`)); r.status != 400 {
		t.Errorf("consent with invalid UTF-8: %d %s", r.status, r.body)
	}
}

func (e *env) testUnknownPhoneNumberID(t *testing.T) {
	e.t = t
	body := fakewa.StatusNotification("999000999000999", "wamid.UNKNOWN", "delivered", "33600000309", "", time.Now())
	// Signed, but with a secret nothing here can check it against.
	if st := e.webhook(body, e.secrets["org-1"]); st != 401 && st != 404 {
		t.Errorf("a notification for an unknown phone number ID: %d, want 401 or 404", st)
	}
}

func (e *env) testCancelAudited(t *testing.T) {
	e.t = t
	const d = 306
	e.consent("org-1", d, "GRANTED")
	to := "+33600000310"
	e.fake.FailRecipient(to, 131026)
	m := e.create("org-1", sendBody(d, to), 201)
	e.waitStatus("org-1", m.ID, "FAILED")
	req, _ := http.NewRequest("POST", e.ts.URL+"/admin/api/messages/"+m.ID+"/cancel?tenant=org-1", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("admin cancel: %d", res.StatusCode)
	}
	if got := e.get("org-1", m.ID); got.Status != "CANCELLED" {
		t.Fatalf("after the cancel: %+v", got)
	}
	as := e.audits("org-1", "/api/v1/outbound/messages/"+m.ID+"/audit-events")
	if a := actions(as); a != "CREATED,FAILED,CANCELLED" || !strings.Contains(as[2].Details, "FAILED") {
		t.Errorf("audit after an operator's cancel: %s %+v", a, as)
	}
	e.fake.FailRecipient(to, 0)
}

func (e *env) testErrorClassOverride(t *testing.T) {
	e.t = t
	const d = 307
	e.consent("org-1", d, "GRANTED")
	// 133004 is retried by default (Meta: server temporarily unavailable);
	// this deployment made it permanent.
	to := "+33600000311"
	e.fake.FailRecipient(to, 133004)
	defer e.fake.FailRecipient(to, 0)
	m := e.create("org-1", sendBody(d, to), 201)
	got := e.waitStatus("org-1", m.ID, "FAILED")
	if got.AttemptCount != 1 || got.ErrorCode != "133004" {
		t.Errorf("133004 made permanent: %+v", got)
	}
}
