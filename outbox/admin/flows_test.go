package admin_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// adminStore is a store the console operates.
type adminStore interface {
	outbox.Store
	outbox.Admin
}

// consoleSeed is what seedConsole put in a store.
type consoleSeed struct {
	sent      outbox.Message   // SENT, topic mail, traceparent header, provider ID
	dead      []outbox.Message // FAILED, topic mail, code rejected, tenant T1
	pending   []outbox.Message // PENDING, topic mail, tenant T2, group gp
	retrying  outbox.Message   // PENDING, topic sms, group gr, waiting for a retry
	blocking  outbox.Message   // FAILED, topic sms, group gb, holds its group
	behind    outbox.Message   // PENDING, topic sms, group gb, held
	leased    outbox.Message   // PROCESSING, topic push, claimed by worker-elsewhere
	unclaimed outbox.Message   // PENDING, topic fax: no processor claims it
}

const traceID = "4bf92f3577b34da6a3ce929d0e4736aa"

// seedConsole fills st with a message of every kind the console shows.
func seedConsole(t *testing.T, ctx context.Context, st adminStore, enqueue func(...outbox.Message) []outbox.Message) consoleSeed {
	t.Helper()
	var s consoleSeed
	claim := func(owner string, topics ...string) []outbox.Message {
		t.Helper()
		c, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 100, Topics: topics, Owner: owner, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	finish := func(owner string, os ...outbox.Outcome) {
		t.Helper()
		if _, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: owner, Now: time.Now(), Outcomes: os}); err != nil {
			t.Fatal(err)
		}
	}
	s.sent = enqueue(outbox.Message{Tenant: "T1", Topic: "mail", IdempotencyKey: "order-7-mail", Payload: json.RawMessage(`{"to":"ana"}`),
		Headers: map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}})[0]
	c := claim("seed", "mail")
	finish("seed", outbox.Outcome{Kind: outbox.OutcomeSent, ID: c[0].ID, Topic: "mail", Attempt: c[0].Attempts, ClaimToken: c[0].ClaimToken, ProviderMessageID: "wamid.PROVIDER42", StartedAt: time.Now()})
	s.dead = enqueue(
		outbox.Message{Tenant: "T1", Topic: "mail", Payload: json.RawMessage(`{"d":1}`)},
		outbox.Message{Tenant: "T1", Topic: "mail", Payload: json.RawMessage(`{"d":2}`)},
		outbox.Message{Tenant: "T1", Topic: "mail", Payload: json.RawMessage(`{"d":3}`)})
	var outs []outbox.Outcome
	for _, m := range claim("seed", "mail") {
		outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Topic: "mail", Attempt: m.Attempts, ClaimToken: m.ClaimToken, Error: &outbox.ErrorInfo{Code: "rejected", Message: "bad address"}, StartedAt: time.Now()})
	}
	finish("seed", outs...)
	s.retrying = enqueue(outbox.Message{Topic: "sms", Group: "gr", Payload: json.RawMessage(`{}`)})[0]
	s.blocking = enqueue(outbox.Message{Topic: "sms", Group: "gb", Payload: json.RawMessage(`{}`)})[0]
	if _, err := st.MessageApplyReceipt(ctx, outbox.MessageApplyReceiptParams{Receipt: outbox.Receipt{Tenant: "T1", ProviderMessageID: "wamid.PROVIDER42", Status: outbox.DeliveryDelivered, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	c = claim("seed", "sms")
	if len(c) != 2 {
		t.Fatalf("claimed %d sms messages, want 2", len(c))
	}
	for _, m := range c {
		if m.ID == s.retrying.ID {
			finish("seed", outbox.Outcome{Kind: outbox.OutcomeRetry, ID: m.ID, Topic: "sms", Attempt: m.Attempts, ClaimToken: m.ClaimToken, NextAttemptAt: time.Now().Add(time.Hour),
				Error: &outbox.ErrorInfo{Code: "throttled", Message: "later"}, StartedAt: time.Now()})
		} else {
			finish("seed", outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Topic: "sms", Attempt: m.Attempts, ClaimToken: m.ClaimToken, BlockGroup: true,
				Error: &outbox.ErrorInfo{Code: "invalid", Message: "refused"}, StartedAt: time.Now()})
		}
	}
	s.behind = enqueue(outbox.Message{Topic: "sms", Group: "gb", Payload: json.RawMessage(`{}`)})[0]
	s.leased = enqueue(outbox.Message{Topic: "push", Payload: json.RawMessage(`{}`)})[0]
	claim("worker-elsewhere", "push")
	s.pending = enqueue(
		outbox.Message{Tenant: "T2", Topic: "mail", Group: "gp", Payload: json.RawMessage(`{"p":1}`), NextAttemptAt: time.Now().Add(time.Hour)},
		outbox.Message{Tenant: "T2", Topic: "mail", Group: "gp", Payload: json.RawMessage(`{"p":2}`), NextAttemptAt: time.Now().Add(time.Hour)})
	s.unclaimed = enqueue(outbox.Message{Topic: "fax", Payload: json.RawMessage(`{}`)})[0]
	return s
}

// TestConsoleFlowsInChromium drives every flow of the console in one
// shared Chromium, on SQLite and on PostgreSQL.
func TestConsoleFlowsInChromium(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bctx := sharedBrowser(t)

	t.Run("sqlite", func(t *testing.T) {
		st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "console.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		ob := outbox.New[*sql.Tx](st, outbox.Options{})
		consoleFlows(t, ctx, bctx, st, func(ms ...outbox.Message) []outbox.Message { return enqueued(t, ctx, ob, ms) }, os.Getenv("OUTBOXKIT_SCREENSHOTS") != "")
	})
	t.Run("postgres", func(t *testing.T) {
		_, st, _ := pgStore(t)
		ob := outbox.New[pgx.Tx](st, outbox.Options{})
		consoleFlows(t, ctx, bctx, st, func(ms ...outbox.Message) []outbox.Message { return enqueued(t, ctx, ob, ms) }, false)
	})
}

func enqueued[TTx any](t *testing.T, ctx context.Context, ob *outbox.Outbox[TTx], ms []outbox.Message) []outbox.Message {
	t.Helper()
	res, err := ob.Enqueue(ctx, ms...)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]outbox.Message, len(res))
	for i, r := range res {
		out[i] = r.Message
	}
	return out
}

func consoleFlows(t *testing.T, ctx context.Context, bctx context.Context, st adminStore, enqueue func(...outbox.Message) []outbox.Message, screenshots bool) {
	s := seedConsole(t, ctx, st, enqueue)
	// A processor of this process, for topic mail only: fax is claimed by
	// nobody.
	proc, err := outbox.NewProcessor(st, &outboxtest.Recorder{}, outbox.Config{ID: "local-1", Topics: []string{"mail"},
		PollInterval: 200 * time.Millisecond, UnroutedAfter: time.Millisecond, RecoveryInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- proc.Run(pctx) }()
	t.Cleanup(func() { stop(); <-done })
	h, err := admin.New(admin.Config{Store: st, Authorize: authorize, Processors: []admin.ProcessorReporter{proc}, PendingAgeWarning: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	status := func(tenant, id string) outbox.Status {
		t.Helper()
		m, err := st.MessageGet(ctx, outbox.MessageGetParams{Tenant: tenant, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		return m.Status
	}
	rowIDs := func(tb *tab) string {
		return tb.eval(`[...document.querySelectorAll("#dead tbody tr")].map((r) => r.dataset.id).sort().join(",")`)
	}
	ids := func(ms ...outbox.Message) string {
		var out []string
		for _, m := range ms {
			out = append(out, m.ID)
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	// Wait for the local processor to report the unclaimed topic.
	deadline := time.Now().Add(10 * time.Second)
	for len(proc.Progress().Unrouted) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("states and filters", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/")
		// Dead letters first.
		if got, want := rowIDs(tb), ids(append([]outbox.Message{s.blocking}, s.dead...)...); got != want {
			t.Errorf("dead letters listed %s, want %s", got, want)
		}
		for _, c := range []struct {
			status string
			want   string
		}{
			{"PENDING", ids(s.retrying, s.behind, s.unclaimed, s.pending[0], s.pending[1])},
			{"PROCESSING", ids(s.leased)},
			{"DELIVERED", ids(s.sent)},
		} {
			tb.click(`#states button[data-status="` + c.status + `"]`)
			tb.wait("state "+c.status, `[...document.querySelectorAll("#dead tbody tr")].every((r) => r.dataset.status === "`+c.status+`") && document.querySelectorAll("#dead tbody tr").length > 0`)
			if got := rowIDs(tb); got != c.want {
				t.Errorf("state %s lists %s, want %s", c.status, got, c.want)
			}
			if !strings.Contains(tb.eval(`location.hash`), "status="+c.status) {
				t.Errorf("state %s is not in the URL: %s", c.status, tb.eval(`location.hash`))
			}
		}
		// Each filter of the form, on every state.
		tb.click(`#states button[data-status=""]`)
		for _, c := range []struct {
			field, value, want string
		}{
			{"#f-tenant", "T2", ids(s.pending...)},
			{"#f-topic", "sms", ids(s.retrying, s.blocking, s.behind)},
			{"#f-group", "gb", ids(s.blocking, s.behind)},
			{"#f-error", "rejected", ids(s.dead...)},
		} {
			tb.click(`#f-clear`)
			tb.do("filter "+c.field, chromedp.SetValue(chromedp.CSS(c.field), c.value), chromedp.Click(chromedp.CSS(`#f-apply`)))
			tb.wait("filter "+c.field, `[...document.querySelectorAll("#dead tbody tr")].map((r) => r.dataset.id).sort().join(",") === "`+c.want+`"`)
		}
		// A time filter: nothing was created before 2001.
		tb.click(`#f-clear`)
		tb.do("time filter", chromedp.SetValue(chromedp.CSS(`#f-before`), "2001-01-01T00:00"), chromedp.Click(chromedp.CSS(`#f-apply`)))
		tb.wait("time filter", `document.querySelectorAll("#dead tbody tr").length === 0`)
		tb.click(`#f-clear`)
		tb.wait("cleared", `document.querySelectorAll("#dead tbody tr").length === 11`)
	})

	t.Run("search and a page per message", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/")
		for _, q := range []string{s.sent.ID, "order-7-mail", "wamid.PROVIDER42"} {
			// Keyboard: "/" focuses the search, Enter searches.
			tb.do("search "+q, chromedp.KeyEvent("/"))
			if f := tb.eval(`document.activeElement.id`); f != "search" {
				t.Fatalf("after / the focus is on %q, want the search box", f)
			}
			tb.do("search "+q, chromedp.SetValue(chromedp.CSS(`#search`), q), chromedp.SendKeys(chromedp.CSS(`#search`), "\r"))
			tb.wait("search "+q, `!document.getElementById("detail").hidden && document.getElementById("detail-id").textContent === "`+s.sent.ID+`"`)
			tb.do("escape", chromedp.KeyEvent("\u001b"))
			tb.wait("escape", `document.getElementById("detail").hidden`)
		}
		// The message's own URL opens it in a new tab.
		link := srv.URL + "/ops/#m=" + s.sent.ID + "&mt=T1"
		tb2 := newTab(t, bctx, false)
		tb2.open(link)
		tb2.wait("link", `document.getElementById("detail-id").textContent === "`+s.sent.ID+`"`)
		fields := tb2.eval(`JSON.stringify(Object.fromEntries([...document.querySelectorAll("#detail-fields dd")].map((d) => [d.dataset.field, d.textContent])))`)
		for _, want := range []string{`"Trace ID":"` + traceID + `"`, `"Provider message ID":"wamid.PROVIDER42"`, `"Idempotency key":"order-7-mail"`, `"Status":"DELIVERED"`} {
			if !strings.Contains(fields, want) {
				t.Errorf("the message page shows %s, want %s in it", fields, want)
			}
		}
		history := tb2.text(`#history`)
		if !strings.Contains(history, "created") || !strings.Contains(history, "attempt 1: SUCCEEDED") || !strings.Contains(history, "sent as wamid.PROVIDER42") ||
			!strings.Contains(history, "delivery receipt") {
			t.Errorf("history reads %q", history)
		}
		if p := tb2.text(`#detail-payload`); !strings.Contains(p, `"to": "ana"`) {
			t.Errorf("payload reads %q", p)
		}
		if n := tb2.eval(`String(document.querySelectorAll("#attempts tbody tr").length)`); n != "1" {
			t.Errorf("%s attempts shown, want 1", n)
		}
	})

	t.Run("bulk select, bulk requeue and cancel with a dry run", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/#error_code=rejected")
		tb.wait("filter from URL", `document.querySelectorAll("#dead tbody tr").length === 3`)
		if v := tb.eval(`document.getElementById("f-error").value`); v != "rejected" {
			t.Errorf("the form shows error code %q from the URL", v)
		}
		// Select two, requeue the selection.
		tb.click(`input.select[data-id="` + s.dead[0].ID + `"]`)
		tb.click(`input.select[data-id="` + s.dead[1].ID + `"]`)
		tb.eval(`window.confirm = () => true; ""`)
		tb.click(`#bulk-requeue-selected`)
		tb.wait("requeue selected", `document.querySelectorAll("#dead tbody tr").length === 1`)
		// The local processor may publish a requeued message at once.
		if a, b, c := status("T1", s.dead[0].ID), status("T1", s.dead[1].ID), status("T1", s.dead[2].ID); a == outbox.StatusFailed || b == outbox.StatusFailed || c != outbox.StatusFailed {
			t.Errorf("after requeueing the selection: %s %s %s, want the two selected requeued and the third FAILED", a, b, c)
		}
		// Cancel every PENDING mail of tenant T2: the dry run counts first.
		tb = newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/#status=PENDING&tenant=T2&topic=mail")
		tb.eval(`window.confirm = () => true; ""`)
		tb.wait("T2", `document.querySelectorAll("#dead tbody tr").length === 2`)
		tb.click(`#bulk-cancel`)
		tb.wait("dry run", `!document.getElementById("bulk-preview").hidden`)
		if got := tb.text(`#bulk-preview-text`); got != "Cancel 2 matching messages?" {
			t.Errorf("the dry run reads %q", got)
		}
		if st := status("T2", s.pending[0].ID); st != outbox.StatusPending {
			t.Fatalf("the dry run changed %s to %s", s.pending[0].ID, st)
		}
		tb.click(`#bulk-confirm`)
		tb.wait("cancel", `document.querySelectorAll("#dead tbody tr").length === 0`)
		for _, m := range s.pending {
			if st := status("T2", m.ID); st != outbox.StatusCancelled {
				t.Errorf("after the bulk cancel %s is %s", m.ID, st)
			}
		}
		// Requeue all matching: the dead letter left.
		tb = newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/#error_code=rejected")
		tb.wait("rejected", `document.querySelectorAll("#dead tbody tr").length === 1`)
		tb.click(`#bulk-requeue`)
		tb.wait("dry run", `!document.getElementById("bulk-preview").hidden`)
		if got := tb.text(`#bulk-preview-text`); got != "Requeue 1 matching messages?" {
			t.Errorf("the dry run reads %q", got)
		}
		tb.click(`#bulk-confirm`)
		tb.wait("requeue", `document.querySelectorAll("#dead tbody tr").length === 0`)
		if st := status("T1", s.dead[2].ID); st == outbox.StatusFailed {
			t.Errorf("after the bulk requeue %s is %s", s.dead[2].ID, st)
		}
	})

	t.Run("groups and pauses", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/")
		held := func(group string) string {
			return tb.eval(`(document.querySelector('#groups-table tr[data-group="` + group + `"] td.held') || {}).dataset?.heldBy || "none"`)
		}
		if h := held("gb"); h != "dead_letter" {
			t.Errorf("group gb is held by %q, want its dead letter", h)
		}
		if h := held("gr"); h != "retry" {
			t.Errorf("group gr is held by %q, want a retry", h)
		}
		if head := tb.eval(`document.querySelector('#groups-table tr[data-group="gb"] td:nth-child(5)').textContent`); head != s.behind.ID {
			t.Errorf("group gb's head is %q, want %s", head, s.behind.ID)
		}
		// Pause group gr for every tenant, from its row.
		tb.click(`#groups-table tr[data-group="gr"] button.pause-all`)
		tb.wait("pause group", `(document.querySelector('#groups-table tr[data-group="gr"] td.held') || {}).dataset?.heldBy === "pause"`)
		ps, err := st.PauseList(ctx, outbox.PauseListParams{})
		if err != nil || len(ps) != 1 || ps[0].Topic != "sms" || ps[0].Group != "gr" || ps[0].Tenant != "" {
			t.Fatalf("after Pause the store has %+v (%v), want sms/gr for every tenant", ps, err)
		}
		tb.click(`#groups-table tr[data-group="gr"] button.resume`)
		tb.wait("resume group", `(document.querySelector('#groups-table tr[data-group="gr"] td.held') || {}).dataset?.heldBy === "retry"`)
		// Only blocked groups.
		tb.click(`#groups-blocked`)
		tb.wait("blocked", `[...document.querySelectorAll("#groups-table tbody tr")].map((r) => r.dataset.group).join() === "gb"`)
		// Pause a topic for one tenant, then resume it.
		tb.do("tenant", chromedp.SetValue(chromedp.CSS(`#pause-tenant`), "T1"))
		tb.eval(`document.getElementById("pause-tenant").dispatchEvent(new Event("change")); ""`)
		tb.click(`#stats tr[data-topic="mail"] button.pause`)
		tb.wait("pause topic", `!!document.querySelector('#stats tr[data-topic="mail"] button.resume')`)
		ps, _ = st.PauseList(ctx, outbox.PauseListParams{})
		if len(ps) != 1 || ps[0].Topic != "mail" || ps[0].Group != "" || ps[0].Tenant != "T1" {
			t.Fatalf("after the topic's Pause the store has %+v, want mail for tenant T1", ps)
		}
		if p := tb.text(`#stats tr[data-topic="mail"] td.paused`); p != "all (T1)" {
			t.Errorf("the topic row says paused %q", p)
		}
		tb.click(`#stats tr[data-topic="mail"] button.resume`)
		tb.wait("resume topic", `!!document.querySelector('#stats tr[data-topic="mail"] button.pause')`)
		if ps, _ = st.PauseList(ctx, outbox.PauseListParams{}); len(ps) != 0 {
			t.Errorf("after Resume the store has %+v", ps)
		}
	})

	t.Run("processors, pictures and warnings", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(srv.URL + "/ops/")
		if got := tb.eval(`document.querySelector('#processors-table tr[data-processor="worker-elsewhere"] td[data-leases]').textContent`); got != "1" {
			t.Errorf("worker-elsewhere shows %s leases, want 1", got)
		}
		if got := tb.eval(`document.querySelector('#processors-table tr[data-processor="local-1"] td:nth-child(2)').textContent`); got != "healthy" {
			t.Errorf("the local processor shows %q, want healthy", got)
		}
		// The local processor published the requeued mail dead letters.
		published := tb.eval(`document.querySelector('#chart-throughput polyline[data-series="published"]').dataset.total`)
		enqueuedN := tb.eval(`document.querySelector('#chart-throughput polyline[data-series="enqueued"]').dataset.total`)
		if n, _ := strconv.Atoi(published); n < 1 {
			t.Errorf("the throughput picture shows %s published, want the sent message at least", published)
		}
		if enqueuedN != "11" {
			t.Errorf("the throughput picture shows %s enqueued, want 11", enqueuedN)
		}
		if n := tb.eval(`String(document.querySelectorAll('#chart-latency polyline').length)`); n != "2" {
			t.Errorf("the latency picture has %s lines, want 2", n)
		}
		if d := tb.eval(`document.querySelector('#chart-depth rect[data-topic="push"]').dataset.depth`); d != "1" {
			t.Errorf("the depth of push shows %s, want 1 (its leased message)", d)
		}
		warnings := tb.eval(`JSON.stringify([...document.querySelectorAll("#warnings li")].map((l) => l.dataset.kind + ":" + l.dataset.topic))`)
		for _, want := range []string{`"unclaimed_topic:fax"`, `"old_pending:fax"`, `"blocked_groups:"`} {
			if !strings.Contains(warnings, want) {
				t.Errorf("warnings %s, want %s among them", warnings, want)
			}
		}
		if screenshots {
			shoot(t, tb, "console-overview.png", "")
			shoot(t, tb, "console-groups.png", "groups")
			tb = newTab(t, bctx, false)
			tb.open(srv.URL + "/ops/#status=&m=" + s.sent.ID + "&mt=T1")
			tb.wait("detail", `document.getElementById("detail-id").textContent === "`+s.sent.ID+`"`)
			shoot(t, tb, "console-message.png", "")
		}
	})
}

// shoot saves a PNG of the tab (scrolled to section, when set) in docs/.
func shoot(t *testing.T, tb *tab, name, section string) {
	t.Helper()
	if section != "" {
		tb.eval(`document.getElementById("` + section + `").scrollIntoView(); ""`)
		time.Sleep(200 * time.Millisecond)
	}
	png, err := chromedp.Run(tb.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("chromium: screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join("..", "..", "docs", name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Println("wrote docs/" + name)
}
