package admin_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

const token = "Bearer operator-token"

type fixture struct {
	t      *testing.T
	ctx    context.Context
	store  *sqlite.Store
	srv    *httptest.Server
	dead   []outbox.Message // FAILED, code http_400, topic orders
	other  outbox.Message   // FAILED, code quota, topic sms, tenant B
	queued []outbox.Message // PENDING, topic orders
}

func authorize(r *http.Request) error {
	if r.Header.Get("Authorization") != token {
		return errors.New("no operator token")
	}
	return nil
}

// newFixture builds a sqlite store with 3 dead letters and 1 other of
// "orders", 1 dead letter of "sms" (tenant B) and 2 PENDING "orders"
// messages, and serves the admin handler under /ops/.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "admin.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: ctx, store: st}
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	enq := func(m outbox.Message) outbox.Message {
		res, err := ob.Enqueue(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Message
	}
	for i := range 3 {
		f.dead = append(f.dead, enq(outbox.Message{Topic: "orders", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}))
	}
	f.other = enq(outbox.Message{Tenant: "B", Topic: "sms", Group: "c1", Payload: json.RawMessage(`{"n":9}`)})
	claimed, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "seed", Now: time.Now()})
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	fin := outbox.MessageFinishParams{Owner: "seed", Now: time.Now()}
	for _, m := range claimed {
		code := "http_400"
		if m.Topic == "sms" {
			code = "quota"
		}
		fin.Outcomes = append(fin.Outcomes, outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, Error: &outbox.ErrorInfo{Code: code, Message: "refused by the provider"}, StartedAt: time.Now()})
	}
	if _, err := st.MessageFinish(ctx, fin); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		f.queued = append(f.queued, enq(outbox.Message{Topic: "orders", Payload: json.RawMessage(fmt.Sprintf(`{"q":%d}`, i)), NextAttemptAt: time.Now().Add(time.Hour)}))
	}
	h, err := admin.New(admin.Config{Store: st, Authorize: authorize})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", h))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// do sends a request with the operator token (unless auth is false) and
// decodes a JSON answer into out.
func (f *fixture) do(method, path string, body any, auth bool, out any) int {
	f.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(f.ctx, method, f.srv.URL+"/ops/"+path, r)
	if auth {
		req.Header.Set("Authorization", token)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("%s %s: %d %s: %v", method, path, res.StatusCode, data, err)
		}
	}
	return res.StatusCode
}

func (f *fixture) status(tenant, id string) outbox.Status {
	f.t.Helper()
	m, err := f.store.MessageGet(f.ctx, outbox.MessageGetParams{Tenant: tenant, ID: id})
	if err != nil {
		f.t.Fatal(err)
	}
	return m.Status
}

func (f *fixture) counts() map[outbox.Status]int64 {
	f.t.Helper()
	c, err := f.store.MessageCount(f.ctx, outbox.MessageCountParams{AllTenants: true})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func TestNewRefusesMisconfiguration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := admin.New(admin.Config{Store: f.store}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("New without Authorize: %v, want ErrInvalidInput", err)
	}
	if _, err := admin.New(admin.Config{Authorize: authorize}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("New without Store: %v, want ErrInvalidInput", err)
	}
	type storeOnly struct{ outbox.Store }
	if _, err := admin.New(admin.Config{Store: storeOnly{f.store}, Authorize: authorize}); !errors.Is(err, outbox.ErrNotAdmin) {
		t.Errorf("New with a store without Admin: %v, want ErrNotAdmin", err)
	}
	for _, realm := range []string{`a"b`, `a\b`, "a\nb", "ré"} {
		if _, err := admin.New(admin.Config{Store: f.store, Authorize: authorize, BasicAuthRealm: realm}); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("New with BasicAuthRealm %q: %v, want ErrInvalidInput", realm, err)
		}
	}
}

func TestUnauthenticatedChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	before := f.counts()
	var e struct{ Error string }
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, ""},
		{http.MethodGet, "api/stats"},
		{http.MethodPost, "api/messages/" + f.dead[0].ID + "/requeue"},
		{http.MethodPost, "api/requeue"},
		{http.MethodPost, "api/pauses"},
	} {
		body := map[string]any{"all": true, "topic": "orders"}
		if code := f.do(c.method, c.path, body, false, &e); code != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d, want 401", c.method, c.path, code)
		}
	}
	after := f.counts()
	for st, n := range before {
		if after[st] != n {
			t.Fatalf("unauthenticated calls changed the store: %v -> %v", before, after)
		}
	}
	var pauses []admin.Pause
	f.do(http.MethodGet, "api/pauses", nil, true, &pauses)
	if len(pauses) != 0 {
		t.Fatalf("an unauthenticated pause was stored: %v", pauses)
	}
}

func TestBadInputIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var e struct{ Error string }
	cases := []struct {
		method, path string
		body         any
		want         int
	}{
		{http.MethodGet, "api/messages?colour=red", nil, 400},
		{http.MethodGet, "api/messages?status=LOST", nil, 400},
		{http.MethodGet, "api/messages?created_after=yesterday", nil, 400},
		{http.MethodGet, "api/messages?limit=5000", nil, 400},
		{http.MethodGet, "api/messages?blocks_group=maybe", nil, 400},
		{http.MethodPost, "api/requeue", map[string]any{}, 400},                                              // empty filter, no all
		{http.MethodPost, "api/requeue", map[string]any{"filter": map[string]any{"status": "PENDING"}}, 400}, // only dead letters
		{http.MethodPost, "api/requeue", map[string]any{"filter": map[string]any{"colour": "red"}}, 400},     // unknown filter
		{http.MethodPost, "api/messages/" + f.queued[0].ID + "/requeue", nil, 409},                           // not FAILED
		{http.MethodPost, "api/messages/NOPE/requeue", nil, 404},
		{http.MethodPost, "api/messages/NOPE/cancel", nil, 404},
		{http.MethodPost, "api/pauses", map[string]any{"group": "g"}, 400}, // no topic
		{http.MethodDelete, "api/pauses?topic=none", nil, 404},
		{http.MethodGet, "api/nothing", nil, 404},
		{http.MethodPost, "api/cancel", map[string]any{}, 400},                                           // no status
		{http.MethodPost, "api/cancel", map[string]any{"filter": map[string]any{"status": "SENT"}}, 400}, // not cancellable
		{http.MethodPost, "api/cancel", map[string]any{"filter": map[string]any{"status": "FAILED"}, "after_seq": -1}, 400},
		{http.MethodPost, "api/cancel", map[string]any{"filter": map[string]any{"status": "FAILED"}, "all": true}, 400}, // unknown field
		{http.MethodGet, "api/search", nil, 400},
		{http.MethodGet, "api/search?q=x&colour=red", nil, 400},
		{http.MethodGet, "api/groups?blocked=maybe", nil, 400},
		{http.MethodGet, "api/processors?x=1", nil, 400},
		{http.MethodGet, "api/activity?x=1", nil, 400},
		{http.MethodGet, "api/fleet?x=1", nil, 400},
		{http.MethodGet, "api/fleet", nil, 404}, // no fleet configured
	}
	before := f.counts()
	for _, c := range cases {
		e.Error = ""
		if code := f.do(c.method, c.path, c.body, true, &e); code != c.want || e.Error == "" {
			t.Errorf("%s %s %v: %d %q, want %d with an error message", c.method, c.path, c.body, code, e.Error, c.want)
		}
	}
	// A form post (no JSON content type) is refused: no cross-site writes.
	req, _ := http.NewRequestWithContext(f.ctx, http.MethodPost, f.srv.URL+"/ops/api/messages/"+f.dead[0].ID+"/requeue", strings.NewReader("x=1"))
	req.Header.Set("Authorization", token)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("form POST: %d, want 415", res.StatusCode)
	}
	after := f.counts()
	for st, n := range before {
		if after[st] != n {
			t.Fatalf("refused requests changed the store: %v -> %v", before, after)
		}
	}
}

func TestAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	var stats admin.Stats
	if code := f.do(http.MethodGet, "api/stats", nil, true, &stats); code != 200 {
		t.Fatalf("stats: %d", code)
	}
	if len(stats.Topics) != 2 || stats.Topics[0].Topic != "orders" || stats.Topics[0].Counts[outbox.StatusFailed] != 3 ||
		stats.Topics[0].Counts[outbox.StatusPending] != 2 || stats.Topics[1].Counts[outbox.StatusFailed] != 1 || stats.Totals[outbox.StatusFailed] != 4 {
		t.Fatalf("stats = %+v", stats)
	}
	if stats.Storage != nil {
		t.Errorf("a store without a storage report (sqlite) answered one: %+v", stats.Storage)
	}
	if stats.Fleet {
		t.Error("stats say a fleet is configured; Config.Fleet is nil")
	}
	if stats.Topics[0].OldestPendingAt == nil || stats.Topics[0].OldestPendingAgeSeconds < 0 {
		t.Errorf("orders has PENDING messages but no oldest pending time: %+v", stats.Topics[0])
	}

	// List with filters, across tenants, paged.
	var page admin.Page
	f.do(http.MethodGet, "api/messages?status=FAILED&limit=2", nil, true, &page)
	if len(page.Messages) != 2 || page.NextAfterSeq == 0 {
		t.Fatalf("first page of dead letters: %d messages, next %d", len(page.Messages), page.NextAfterSeq)
	}
	f.do(http.MethodGet, fmt.Sprintf("api/messages?status=FAILED&limit=2&after_seq=%d", page.NextAfterSeq), nil, true, &page)
	if len(page.Messages) != 2 || page.NextAfterSeq != 0 || page.Messages[1].ID != f.other.ID || page.Messages[1].ErrorCode != "quota" {
		t.Fatalf("second page: %+v", page)
	}
	f.do(http.MethodGet, "api/messages?tenant=B&error_code=quota", nil, true, &page)
	if len(page.Messages) != 1 || page.Messages[0].ID != f.other.ID {
		t.Fatalf("tenant B, code quota: %+v", page)
	}
	// None of these dead letters holds its group.
	if code := f.do(http.MethodGet, "api/messages?blocks_group=true", nil, true, &page); code != 200 || len(page.Messages) != 0 {
		t.Fatalf("blocked groups: %d %+v, want none", code, page)
	}

	// One message with its attempts.
	var d admin.Detail
	if code := f.do(http.MethodGet, "api/messages/"+f.other.ID+"?tenant=B", nil, true, &d); code != 200 {
		t.Fatalf("get: %d", code)
	}
	if d.Message.Status != outbox.StatusFailed || len(d.Attempts) != 1 || d.Attempts[0].Outcome != outbox.AttemptFailed || d.Attempts[0].ErrorCode != "quota" {
		t.Fatalf("detail = %+v", d)
	}

	// Bulk requeue: dry run, then for real in chunks of 2 (3 messages).
	var rr admin.RequeueResponse
	f.do(http.MethodPost, "api/requeue", admin.RequeueRequest{Filter: admin.Filter{ErrorCode: "http_400"}, DryRun: true}, true, &rr)
	if rr.Matched != 3 || rr.Requeued != 0 || f.status("", f.dead[0].ID) != outbox.StatusFailed {
		t.Fatalf("dry run = %+v", rr)
	}
	if code := f.do(http.MethodPost, "api/requeue", admin.RequeueRequest{Filter: admin.Filter{Topic: "orders"}, Limit: 2}, true, &rr); code != 200 || rr.Requeued != 3 || rr.NextAfterSeq != 0 {
		t.Fatalf("requeue = %d %+v", code, rr)
	}
	for _, m := range f.dead {
		if st := f.status("", m.ID); st != outbox.StatusPending {
			t.Errorf("%s is %s after the bulk requeue, want PENDING", m.ID, st)
		}
	}
	if st := f.status("B", f.other.ID); st != outbox.StatusFailed {
		t.Errorf("the sms dead letter is %s, want FAILED (not matched)", st)
	}

	// Requeue one; cancel one.
	var m admin.Message
	if code := f.do(http.MethodPost, "api/messages/"+f.other.ID+"/requeue?tenant=B", nil, true, &m); code != 200 || m.Status != outbox.StatusPending {
		t.Fatalf("requeue one: %d %+v", code, m)
	}
	if code := f.do(http.MethodPost, "api/messages/"+f.queued[0].ID+"/cancel", nil, true, &m); code != 200 || m.Status != outbox.StatusCancelled {
		t.Fatalf("cancel: %d %+v", code, m)
	}
	var e struct{ Error string }
	if code := f.do(http.MethodPost, "api/messages/"+f.queued[0].ID+"/cancel", nil, true, &e); code != 409 || e.Error == "" {
		t.Fatalf("cancel of a cancelled message: %d %q, want 409 with an error message", code, e.Error)
	}

	// Pause and resume: the claim honours it.
	if code := f.do(http.MethodPost, "api/pauses", admin.Pause{Topic: "orders"}, true, nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	claimed, err := f.store.MessageClaim(f.ctx, outbox.MessageClaimParams{Limit: 100, Owner: "x", Now: time.Now()})
	if err != nil || len(claimed) != 1 || claimed[0].ID != f.other.ID {
		t.Fatalf("claim while orders is paused: %d messages, %v; want only the sms one", len(claimed), err)
	}
	if code := f.do(http.MethodDelete, "api/pauses?topic=orders", nil, true, nil); code != 200 {
		t.Fatalf("resume: %d", code)
	}
	claimed, err = f.store.MessageClaim(f.ctx, outbox.MessageClaimParams{Limit: 100, Owner: "x", Now: time.Now()})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim after resume: %d messages, %v; want the 3 requeued orders", len(claimed), err)
	}
}
