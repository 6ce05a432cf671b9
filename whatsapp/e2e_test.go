package whatsapp

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// e2eBackend is a real store plus a way to enqueue in the caller's
// transaction, committing or rolling back.
type e2eBackend struct {
	store   outbox.Store
	enqueue func(t *testing.T, commit bool, msgs ...outbox.Message)
}

func sqliteE2E(t *testing.T, clock outbox.Clock) e2eBackend {
	st := newSQLiteStore(t, clock)
	ob := outbox.New[*sql.Tx](st, outbox.Options{Clock: clock})
	return e2eBackend{store: st, enqueue: func(t *testing.T, commit bool, msgs ...outbox.Message) {
		t.Helper()
		ctx := context.Background()
		// InTx begins IMMEDIATE: this transaction reads before it writes,
		// which a deferred SQLite transaction cannot do safely beside a
		// running processor (SQLITE_BUSY on the lock upgrade).
		errRollback := errors.New("roll back")
		err := st.InTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT)`); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (note) VALUES ('business write')`); err != nil {
				return err
			}
			if _, err := ob.EnqueueTx(ctx, tx, msgs...); err != nil {
				return err
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if err != nil && !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
	}}
}

func postgresE2E(t *testing.T, clock outbox.Clock) e2eBackend {
	pg := testbackend.Postgres(t, 8)
	st, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE `+pg.Name+`.orders (id BIGSERIAL PRIMARY KEY, note TEXT)`); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New[pgx.Tx](st, outbox.Options{Clock: clock})
	return e2eBackend{store: st, enqueue: func(t *testing.T, commit bool, msgs ...outbox.Message) {
		t.Helper()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `INSERT INTO `+pg.Name+`.orders (note) VALUES ('business write')`); err != nil {
			t.Fatal(err)
		}
		if _, err := ob.EnqueueTx(ctx, tx, msgs...); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}}
}

var e2eBackends = []struct {
	name string
	new  func(t *testing.T, clock outbox.Clock) e2eBackend
}{
	{"sqlite", sqliteE2E},
	{"postgres", postgresE2E},
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func listAll(t *testing.T, st outbox.Store, tenant string) []outbox.Message {
	t.Helper()
	page, err := st.MessageList(context.Background(), outbox.MessageListParams{Tenant: tenant, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Messages
}

func signedPost(t *testing.T, url string, body []byte, secret string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(body, secret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestEndToEnd: enqueue in a transaction → processor → publisher → fake
// Cloud API → signed webhook receipts → DELIVERED in the store, with the
// attempts and the observer events recorded.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			testEndToEnd(t, be.new(t, nil))
		})
	}
}

func testEndToEnd(t *testing.T, b e2eBackend) {
	ctx := context.Background()
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, body map[string]any, n int) {
		if body["to"] == "+33700000000" {
			writeMetaError(w, 400, 131026, "Message undeliverable")
			return
		}
		writeSuccess(w, body, n)
	})
	state := NewMemoryState(QuotaOptions{})
	obs := &recObserver{}
	pub, err := NewPublisher(Config{Credentials: testCreds(), BaseURL: api.srv.URL, Windows: state, Quotas: state})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := NewWebhook(WebhookConfig{Credentials: testCreds(), Receipts: b.store, Windows: state, Dedup: state, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/webhooks/whatsapp", hook)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	hookURL := srv.URL + "/webhooks/whatsapp"

	// The user writes first: the inbound webhook opens the session window,
	// so the free-form reply below is allowed.
	in := inboundBody(testPhoneID, inboundMsg("wamid.USER1", time.Now().Unix()))
	if code := signedPost(t, hookURL, in, testSecret); code != 200 {
		t.Fatalf("inbound webhook: %d", code)
	}

	router := outbox.NewRouter().Handle("whatsapp", pub)
	p, err := outbox.NewProcessor(b.store, router, outbox.Config{PollInterval: 20 * time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("processor did not stop")
		}
	})

	b.enqueue(t, true,
		outbox.Message{Tenant: "org-1", Topic: "whatsapp", Group: "16505551234", IdempotencyKey: "order-1-confirmation", Payload: json.RawMessage(templatePayload)},
		outbox.Message{Tenant: "org-1", Topic: "whatsapp", Group: "16505551234", IdempotencyKey: "order-1-reply", Payload: json.RawMessage(textPayload)},
		outbox.Message{Tenant: "org-1", Topic: "whatsapp", IdempotencyKey: "order-2-undeliverable", Payload: json.RawMessage(`{"to":"+33700000000","templateCode":"x"}`)},
	)
	b.enqueue(t, false, outbox.Message{Tenant: "org-1", Topic: "whatsapp", IdempotencyKey: "rolled-back", Payload: json.RawMessage(templatePayload)})
	p.Wake()

	waitFor(t, "the processor to finish every message", 20*time.Second, func() bool {
		for _, m := range listAll(t, b.store, "org-1") {
			if m.Status != outbox.StatusSent && m.Status != outbox.StatusFailed {
				return false
			}
		}
		return true
	})
	msgs := listAll(t, b.store, "org-1")
	if len(msgs) != 3 {
		t.Fatalf("%d messages in the store; the rolled-back enqueue must not exist", len(msgs))
	}
	byKey := map[string]outbox.Message{}
	for _, m := range msgs {
		byKey[m.IdempotencyKey] = m
	}
	if n := len(api.requests()); n != 3 {
		t.Fatalf("%d API calls, want 3", n)
	}
	bad := byKey["order-2-undeliverable"]
	if bad.Status != outbox.StatusFailed || bad.LastError == nil || bad.LastError.Code != "131026" || bad.Attempts != 1 {
		t.Fatalf("undeliverable: %s %+v attempts %d", bad.Status, bad.LastError, bad.Attempts)
	}

	// Meta reports the deliveries through the signed webhook, out of order
	// and repeated.
	var statuses []wireStatus
	now := time.Now().Unix()
	for _, k := range []string{"order-1-reply", "order-1-confirmation"} {
		m := byKey[k]
		if m.Status != outbox.StatusSent || !strings.HasPrefix(m.ProviderMessageID, "wamid.TEST") {
			t.Fatalf("%s: %s %q", k, m.Status, m.ProviderMessageID)
		}
		statuses = append(statuses, st(m.ProviderMessageID, "delivered", now), st(m.ProviderMessageID, "sent", now-1), st(m.ProviderMessageID, "delivered", now))
	}
	body := statusBody(testPhoneID, statuses...)
	for i := 0; i < 2; i++ {
		if code := signedPost(t, hookURL, body, testSecret); code != 200 {
			t.Fatalf("status webhook: %d", code)
		}
	}
	for _, k := range []string{"order-1-reply", "order-1-confirmation"} {
		m := get(t, b.store, "org-1", byKey[k].ID)
		if m.Status != outbox.StatusDelivered || m.DeliveredAt.IsZero() || m.SentAt.IsZero() {
			t.Fatalf("%s: %s delivered %v", k, m.Status, m.DeliveredAt)
		}
		atts, err := b.store.AttemptList(ctx, outbox.AttemptListParams{Tenant: "org-1", MessageID: m.ID})
		if err != nil {
			t.Fatal(err)
		}
		if len(atts) != 1 || atts[0].Outcome != outbox.AttemptSucceeded || !strings.Contains(string(atts[0].ProviderResponse), `"wa_id":"16505551234"`) {
			t.Fatalf("%s attempts = %+v", k, atts)
		}
	}
	atts, _ := b.store.AttemptList(ctx, outbox.AttemptListParams{Tenant: "org-1", MessageID: bad.ID})
	if len(atts) != 1 || atts[0].Outcome != outbox.AttemptFailed || atts[0].Error == nil || atts[0].Error.Code != "131026" {
		t.Fatalf("undeliverable attempts = %+v", atts)
	}

	d, finished, sent, failed := obs.snapshot()
	if len(sent) != 2 || len(failed) != 1 || len(finished) != 3 {
		t.Fatalf("observer: %d sent, %d failed, %d finished; want 2, 1, 3", len(sent), len(failed), len(finished))
	}
	if failed[0].Message.LastError == nil || failed[0].Message.LastError.Code != "131026" {
		t.Fatalf("OnFailed carries %+v", failed[0].Message.LastError)
	}
	for _, e := range sent {
		if e.Message.ProviderMessageID == "" || e.Message.Tenant != "org-1" {
			t.Fatalf("OnSent event = %+v", e.Message)
		}
	}
	if len(d) != 2 {
		t.Fatalf("%d delivery events, want 2 (one per message; repeats change nothing)", len(d))
	}
	for _, e := range d {
		if e.Previous != outbox.StatusSent || e.Message.Status != outbox.StatusDelivered || e.Receipt.Status != outbox.DeliveryDelivered || e.Message.ProviderMessageID == "" {
			t.Fatalf("delivery event = %+v", e)
		}
	}
	if st, _ := state.QuotaGet(ctx, "org-1", time.Now()); st.Sent != 3 {
		t.Fatalf("quota counted %d messages, want 3", st.Sent)
	}
}

// TestRetryTimeline drives the processor and the publisher against a Cloud
// API that always answers a temporary error, with a fake clock: attempts at
// 0, +1, +5, +15, +60 and +360 minutes, then the dead letter.
func TestRetryTimeline(t *testing.T) {
	t.Parallel()
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock(time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC))
			b := be.new(t, clock)
			testRetryTimeline(t, b, clock)
		})
	}
}

func testRetryTimeline(t *testing.T, b e2eBackend, clock *fakeClock) {
	ctx := context.Background()
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, _ map[string]any, _ int) {
		writeMetaError(w, 503, 131016, "Service unavailable")
	})
	obs := &recObserver{}
	pub, err := NewPublisher(Config{Credentials: testCreds(), BaseURL: api.srv.URL, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	p, err := outbox.NewProcessor(b.store, pub, outbox.Config{PollInterval: 20 * time.Millisecond, Clock: clock, Observer: obs, Topics: []string{"whatsapp"}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	t0 := clock.Now()
	b.enqueue(t, true, outbox.Message{Tenant: "org-1", Topic: "whatsapp", Payload: json.RawMessage(templatePayload)})
	p.Wake()
	var id string
	attempts := func() []outbox.Attempt {
		if id == "" {
			if ms := listAll(t, b.store, "org-1"); len(ms) == 1 {
				id = ms[0].ID
			} else {
				return nil
			}
		}
		a, err := b.store.AttemptList(ctx, outbox.AttemptListParams{Tenant: "org-1", MessageID: id})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	wantStart := []time.Duration{0, 1 * time.Minute, 6 * time.Minute, 21 * time.Minute, 81 * time.Minute, 441 * time.Minute}
	for n := 1; n <= len(wantStart); n++ {
		waitFor(t, fmt.Sprintf("attempt %d", n), 10*time.Second, func() bool { return len(attempts()) >= n })
		a := attempts()[n-1]
		if got := a.StartedAt.Sub(t0); got != wantStart[n-1] {
			t.Fatalf("attempt %d started at +%v, want +%v", n, got, wantStart[n-1])
		}
		if a.Error == nil || a.Error.Code != "131016" {
			t.Fatalf("attempt %d error = %+v", n, a.Error)
		}
		if n == len(wantStart) {
			break
		}
		if a.Outcome != outbox.AttemptRetry {
			t.Fatalf("attempt %d outcome = %s, want RETRY", n, a.Outcome)
		}
		delay := wantStart[n] - wantStart[n-1]
		if got := a.NextAttemptAt.Sub(clock.Now()); got != delay {
			t.Fatalf("after attempt %d the next is in %v, want %v", n, got, delay)
		}
		// one second early: nothing happens
		clock.Advance(delay - time.Second)
		p.Wake()
		time.Sleep(100 * time.Millisecond)
		if got := len(attempts()); got != n {
			t.Fatalf("attempt %d ran a second early", got)
		}
		clock.Advance(time.Second)
		p.Wake()
	}
	waitFor(t, "the dead letter", 10*time.Second, func() bool {
		return get(t, b.store, "org-1", id).Status == outbox.StatusFailed
	})
	m := get(t, b.store, "org-1", id)
	if m.Attempts != 6 || m.LastError == nil || m.LastError.Code != "131016" {
		t.Fatalf("dead letter: attempts %d, error %+v", m.Attempts, m.LastError)
	}
	if last := attempts()[5]; last.Outcome != outbox.AttemptFailed {
		t.Fatalf("last attempt outcome %s", last.Outcome)
	}
	if n := len(api.requests()); n != 6 {
		t.Fatalf("%d API calls, want 6", n)
	}
	waitFor(t, "OnFailed", 5*time.Second, func() bool { _, _, _, f := obs.snapshot(); return len(f) == 1 })
	if _, finished, _, _ := obs.snapshot(); len(finished) != 6 {
		t.Fatalf("%d attempt events, want 6", len(finished))
	}
}

// TestReceiptBeforeSentEndToEnd reproduces the race through the processor:
// Meta's "delivered" webhook reaches the service while the Cloud API call
// that sent the message has not returned yet (the message is PROCESSING,
// the store has no wamid). The webhook answers 503 and changes nothing;
// Meta's redelivery, after the processor recorded SENT, makes it DELIVERED.
func TestReceiptBeforeSentEndToEnd(t *testing.T) {
	t.Parallel()
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			testReceiptBeforeSent(t, be.new(t, nil))
		})
	}
}

func testReceiptBeforeSent(t *testing.T, b e2eBackend) {
	ctx := context.Background()
	hook, err := NewWebhook(WebhookConfig{Credentials: testCreds(), Receipts: b.store})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)

	type early struct {
		body   []byte
		code   int
		status outbox.Status // of the message when the webhook ran
		err    error
	}
	got := make(chan early, 1)
	api := newFakeAPI(t)
	api.setHandler(func(w http.ResponseWriter, _ *http.Request, body map[string]any, n int) {
		// Meta delivers the receipt before it answers the send.
		id, _ := body["biz_opaque_callback_data"].(string)
		s := st(fmt.Sprintf("wamid.TEST%d", n), "delivered", time.Now().Unix())
		s.Callback = id
		wb := statusBody(testPhoneID, s)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(wb))
		req.Header.Set(SignatureHeader, Sign(wb, testSecret))
		e := early{body: wb}
		if m, err := b.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: "org-1", ID: id}); err == nil {
			e.status = m.Status
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			e.code = resp.StatusCode
			_ = resp.Body.Close()
		}
		e.err = err
		got <- e
		writeSuccess(w, body, n)
	})
	pub, err := NewPublisher(Config{Credentials: testCreds(), BaseURL: api.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	p, err := outbox.NewProcessor(b.store, pub, outbox.Config{PollInterval: 20 * time.Millisecond, Topics: []string{"whatsapp"}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	b.enqueue(t, true, outbox.Message{Tenant: "org-1", Topic: "whatsapp", IdempotencyKey: "race", Payload: json.RawMessage(templatePayload)})
	p.Wake()
	var e early
	select {
	case e = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not sent")
	}
	if e.err != nil || e.status != outbox.StatusProcessing || e.code != http.StatusServiceUnavailable {
		t.Fatalf("receipt during the send (message %s): %d %v; want 503", e.status, e.code, e.err)
	}
	ms := listAll(t, b.store, "org-1")
	if len(ms) != 1 {
		t.Fatalf("%d messages", len(ms))
	}
	waitFor(t, "SENT recorded", 10*time.Second, func() bool { return get(t, b.store, "org-1", ms[0].ID).Status == outbox.StatusSent })
	if m := get(t, b.store, "org-1", ms[0].ID); !m.DeliveredAt.IsZero() {
		t.Fatalf("the early receipt was applied: %+v", m)
	}
	// Meta redelivers the notification.
	if code := signedPost(t, srv.URL, e.body, testSecret); code != http.StatusOK {
		t.Fatalf("redelivery: %d", code)
	}
	if m := get(t, b.store, "org-1", ms[0].ID); m.Status != outbox.StatusDelivered || m.DeliveredAt.IsZero() {
		t.Fatalf("after the redelivery: %s", m.Status)
	}
}
