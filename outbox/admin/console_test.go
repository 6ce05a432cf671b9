package admin_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
)

// tab is one page of the test's shared Chromium, sized like a laptop
// screen (1366x768).
type tab struct {
	t   *testing.T
	ctx context.Context
}

// newTab opens a tab in the browser (a context from browser) for t.
// fastTimers makes the page's 15 s auto-refresh run every 250 ms, so a test
// sees several refreshes in a second.
func newTab(t *testing.T, browserCtx context.Context, fastTimers bool) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browserCtx)
	t.Cleanup(cancel)
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(cancelT)
	tb := &tab{t: t, ctx: ctx}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1366, 768)); err != nil {
		t.Fatalf("chromium: viewport: %v", err)
	}
	if fastTimers {
		src := `{ const si = window.setInterval; window.setInterval = (f, ms, ...a) => si(f, Math.min(ms, 250), ...a); }`
		if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src}); err != nil {
			t.Fatalf("chromium: %v", err)
		}
	}
	return tb
}

// open loads url with the operator token and waits for the first load.
func (tb *tab) open(url string) {
	tb.t.Helper()
	open(tb.t, tb.ctx, url)
}

func (tb *tab) eval(js string) string {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](js))
	if err != nil {
		tb.t.Fatalf("chromium: %s: %v", js, err)
	}
	return v
}

// text returns the text of the element sel once it is present (read in
// one call: an auto-refresh may replace the node between two).
func (tb *tab) text(sel string) string {
	tb.t.Helper()
	q, _ := json.Marshal(sel)
	tb.wait("text of "+sel, `!!document.querySelector(`+string(q)+`)`)
	return tb.eval(`(document.querySelector(` + string(q) + `) || {}).innerText || ""`)
}

func (tb *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	if err := chromedp.Do(tb.ctx, steps...); err != nil {
		tb.t.Fatalf("chromium: %s: %v", what, err)
	}
}

// click clicks the element sel once it is present (from JavaScript: an
// auto-refresh may replace the node between a lookup and a mouse click).
func (tb *tab) click(sel string) {
	tb.t.Helper()
	q, _ := json.Marshal(sel)
	tb.wait("click "+sel, `(() => { const e = document.querySelector(`+string(q)+`); if (e) e.click(); return !!e; })()`)
}

// wait waits until the JavaScript expression js is true.
func (tb *tab) wait(what, js string) {
	tb.t.Helper()
	if _, err := chromedp.Run(tb.ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		tb.t.Fatalf("chromium: %s: waiting for %s: %v", what, js, err)
	}
}

// waitRefreshes waits until the page has refreshed n more times.
func (tb *tab) waitRefreshes(n int) {
	tb.t.Helper()
	start, _ := strconv.Atoi(tb.eval(`document.body.dataset.refreshes || "0"`))
	deadline := time.Now().Add(45 * time.Second)
	for {
		now, _ := strconv.Atoi(tb.eval(`document.body.dataset.refreshes || "0"`))
		if now >= start+n {
			return
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("the page refreshed %d times in 45 s, want %d (auto-refresh)", now-start, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deadLetters adds n dead letters of topic (tenant "") to the fixture's
// store, with error code code.
func (f *fixture) deadLetters(n int, topic, code string) []outbox.Message {
	f.t.Helper()
	ob := outbox.New[*sql.Tx](f.store, outbox.Options{})
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"bulk":%d}`, i))}
	}
	if _, err := ob.Enqueue(f.ctx, msgs...); err != nil {
		f.t.Fatal(err)
	}
	claimed, err := f.store.MessageClaim(f.ctx, outbox.MessageClaimParams{Limit: n, Topics: []string{topic}, Owner: "seed", Now: time.Now()})
	if err != nil || len(claimed) != n {
		f.t.Fatalf("claim: %d of %d, %v", len(claimed), n, err)
	}
	fin := outbox.MessageFinishParams{Owner: "seed", Now: time.Now()}
	for _, m := range claimed {
		fin.Outcomes = append(fin.Outcomes, outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Topic: topic, Attempt: m.Attempts, ClaimToken: m.ClaimToken,
			Error: &outbox.ErrorInfo{Code: code, Message: "refused"}, StartedAt: time.Now()})
	}
	if _, err := f.store.MessageFinish(f.ctx, fin); err != nil {
		f.t.Fatal(err)
	}
	return claimed
}

// misalignedCells lists, for every visible table, the numeric cells (class
// n) whose text does not sit under their own column header's text: the
// cell's text must overlap its header's text horizontally, and be nearer
// to it than to any other header's.
const misalignedCells = `(() => {
  const rect = (el) => { const r = document.createRange(); r.selectNodeContents(el); return r.getBoundingClientRect(); };
  const gap = (a, b) => Math.max(0, Math.max(a.left, b.left) - Math.min(a.right, b.right));
  const bad = [];
  for (const table of document.querySelectorAll("table")) {
    if (!table.tHead || !table.tBodies[0]) continue;
    const heads = [...table.tHead.rows[0].cells].map((th) => ({ text: th.textContent, r: rect(th) }));
    for (const tr of table.tBodies[0].rows) {
      [...tr.cells].forEach((td, j) => {
        const r = rect(td);
        if (!td.classList.contains("n") || r.width === 0 || !heads[j] || heads[j].r.width === 0) return;
        const own = heads[j].r;
        const overlaps = r.right > own.left && r.left < own.right;
        const nearer = heads.find((h, k) => k !== j && h.r.width > 0 && gap(r, h.r) < gap(r, own));
        if (!overlaps || nearer) bad.push(table.id + ": " + JSON.stringify(td.textContent) + " under " + JSON.stringify(heads[j].text) + (nearer ? " is nearer " + JSON.stringify(nearer.text) : ""));
      });
    }
  }
  return JSON.stringify(bad);
})()`

// TestConsoleDefectsInChromium drives the dashboard in one shared Chromium:
// auto-refresh keeps paging, the filter and the open message; the message
// detail opens in view; numeric cells sit under their headers; and a host
// that checks Basic auth gets the browser's login.
func TestConsoleDefectsInChromium(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bctx := sharedBrowser(t)
	holding, _ := f.blockingDeadLetter("C", "orders", "g1")
	bulk := f.deadLetters(120, "bulk", "http_500")

	t.Run("auto-refresh keeps paging, filter and the open message", func(t *testing.T) {
		tb := newTab(t, bctx, true)
		tb.open(f.srv.URL + "/ops/")
		rows := func() int {
			n, _ := strconv.Atoi(tb.eval(`String(document.querySelectorAll("#dead tbody tr").length)`))
			return n
		}
		tb.click(`#more`)
		tb.wait("more", `document.querySelectorAll("#dead tbody tr").length === 100`)
		target := bulk[70]
		tb.click(`button.show[data-id="` + target.ID + `"]`)
		tb.do("open", chromedp.WaitVisible(chromedp.CSS(`#attempts tbody tr`)))
		tb.waitRefreshes(2)
		if n := rows(); n != 100 {
			t.Errorf("after auto-refresh the list shows %d rows, want the 100 paged in", n)
		}
		if got := tb.eval(`document.getElementById("detail").hidden ? "" : document.getElementById("detail-id").textContent`); got != target.ID {
			t.Errorf("after auto-refresh the open message is %q, want %s", got, target.ID)
		}
		tb.click(`#only-blocking`)
		tb.do("filter", chromedp.WaitNotPresent(chromedp.CSS(`#dead tr[data-id="`+bulk[0].ID+`"]`)))
		tb.waitRefreshes(2)
		if n, id := rows(), tb.eval(`document.querySelector("#dead tbody tr").dataset.id`); n != 1 || id != holding.ID {
			t.Errorf("after auto-refresh with the filter on, %d rows (first %s), want the 1 holding dead letter %s", n, id, holding.ID)
		}
	})

	t.Run("the message detail opens in view", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(f.srv.URL + "/ops/")
		for _, m := range []outbox.Message{bulk[0], bulk[40]} {
			tb.click(`button.show[data-id="` + m.ID + `"]`)
			tb.wait("open", `document.getElementById("detail-id").textContent === "`+m.ID+`"`)
			inView := tb.eval(`(() => { const r = document.getElementById("detail").getBoundingClientRect();
				return String(r.top >= 0 && r.top < innerHeight / 2 && r.height > 0); })()`)
			if inView != "true" {
				t.Errorf("the detail of %s opened at %s (viewport %s high), want it in view", m.ID,
					tb.eval(`String(document.getElementById("detail").getBoundingClientRect().top)`), tb.eval(`String(innerHeight)`))
			}
		}
	})

	t.Run("numeric columns sit under their headers", func(t *testing.T) {
		tb := newTab(t, bctx, false)
		tb.open(f.srv.URL + "/ops/")
		tb.click(`button.show[data-id="` + bulk[1].ID + `"]`)
		tb.do("open", chromedp.WaitVisible(chromedp.CSS(`#attempts tbody tr`)))
		var bad []string
		if err := json.Unmarshal([]byte(tb.eval(misalignedCells)), &bad); err != nil {
			t.Fatal(err)
		}
		checked := tb.eval(`String(document.querySelectorAll("td.n").length)`)
		if checked == "0" {
			t.Fatal("no numeric cell on the page")
		}
		for _, b := range bad {
			t.Errorf("misaligned: %s", b)
		}
	})

	t.Run("Basic auth gets a browser login", func(t *testing.T) {
		h, err := admin.New(admin.Config{Store: f.store, BasicAuthRealm: "outboxkit operators", Authorize: func(r *http.Request) error {
			if u, p, ok := r.BasicAuth(); !ok || u != "op" || p != "s3cret" {
				return fmt.Errorf("not an operator")
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		tb := newTab(t, bctx, false)
		var (
			mu    sync.Mutex
			realm []string
		)
		chromedp.Listen(tb.ctx, func(ev any) {
			switch ev := ev.(type) {
			case *fetch.EventRequestPaused:
				go chromedp.Call(tb.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
			case *fetch.EventAuthRequired:
				mu.Lock()
				realm = append(realm, ev.AuthChallenge.Scheme+" "+ev.AuthChallenge.Realm)
				mu.Unlock()
				go chromedp.Call(tb.ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID,
					AuthChallengeResponse: &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: "op", Password: "s3cret"}})
			}
		})
		yes := true
		if _, err := chromedp.Call(tb.ctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &yes}); err != nil {
			t.Fatalf("chromium: %v", err)
		}
		tb.do("load", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`body[data-loaded="true"]`)))
		mu.Lock()
		got := strings.Join(realm, "; ")
		mu.Unlock()
		if !strings.Contains(strings.ToLower(got), "basic outboxkit operators") {
			t.Errorf("the browser was asked for %q, want a Basic login for realm %q", got, "outboxkit operators")
		}
		if n := tb.eval(`String(document.querySelectorAll("#dead tbody tr").length)`); n == "0" {
			t.Error("logged in, the dashboard lists no dead letter")
		}
		// Without the option, a refusal carries no challenge (a bearer
		// token or session is checked).
		req, _ := http.NewRequestWithContext(f.ctx, http.MethodGet, f.srv.URL+"/ops/api/stats", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") != "" {
			t.Errorf("without BasicAuthRealm: %d, WWW-Authenticate %q; want 401 and none", res.StatusCode, res.Header.Get("WWW-Authenticate"))
		}
	})
}
