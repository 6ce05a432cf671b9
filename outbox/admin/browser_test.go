package admin_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit/outbox"
)

// chromium returns the path of Debian's chromium. Missing, the test skips,
// or fails when OUTBOXKIT_REQUIRE_BACKENDS=1 (CI installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("OUTBOXKIT_REQUIRE_BACKENDS") == "1" {
		t.Fatal("chromium is not installed (apt-get install -y chromium) and OUTBOXKIT_REQUIRE_BACKENDS=1")
	}
	t.Skip("chromium is not installed (apt-get install -y chromium)")
	return ""
}

// TestDashboardInChromium loads the dashboard in a real headless Chromium:
// the page shows the store's counts and oldest pending age, lists the dead
// letters with their errors and attempts, and a click on Requeue makes the
// store show the message PENDING.
func TestDashboardInChromium(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := newTab(t, sharedBrowser(t), false).ctx

	// A dead letter that holds its group (tenant C, group g1) with the
	// group's next message behind it.
	holding, next := f.blockingDeadLetter("C", "orders", "g1")

	stats, err := f.store.TopicStats(f.ctx, outbox.TopicStatsParams{})
	if err != nil {
		t.Fatal(err)
	}
	target := f.dead[1]
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("chromium: text of %s: %v", sel, err)
		}
		return v
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("chromium: %s: %v", js, err)
		}
		return v
	}
	open(t, ctx, f.srv.URL+"/ops/")
	if hidden := eval(`String(document.getElementById("storage").hidden)`); hidden != "true" {
		t.Errorf("the storage section shows for a store without a storage report (sqlite)")
	}
	if hidden := eval(`String(document.getElementById("fleet").hidden && document.getElementById("nav-fleet").hidden)`); hidden != "true" {
		t.Errorf("the fleet section shows without a fleet (Config.Fleet nil)")
	}
	ordersFailed := text(`#stats tr[data-topic="orders"] td[data-status="FAILED"]`)
	ordersPending := text(`#stats tr[data-topic="orders"] td[data-status="PENDING"]`)
	smsFailed := text(`#stats tr[data-topic="sms"] td[data-status="FAILED"]`)
	ageSeconds := eval(`document.querySelector('#stats tr[data-topic="orders"] td[data-age]').dataset.age`)
	deadRows := eval(`String(document.querySelectorAll("#dead tbody tr").length)`)
	errText := text(`#dead tr[data-id="` + target.ID + `"] td.err`)
	// A message's attempt history.
	err = chromedp.Do(ctx,
		chromedp.Click(css(`button.show[data-id="`+target.ID+`"]`)),
		chromedp.WaitVisible(css(`#attempts tbody tr`)),
	)
	if err != nil {
		t.Fatalf("chromium: attempts: %v", err)
	}
	detailRows := eval(`String(document.querySelectorAll("#attempts tbody tr").length)`)
	detailOutcome := text(`#attempts tbody tr td:nth-child(2)`)
	want := func(what, got string, n int64) {
		t.Helper()
		if got != strconv.FormatInt(n, 10) {
			t.Errorf("%s shows %q, the store has %d", what, got, n)
		}
	}
	want("orders FAILED", ordersFailed, stats[0].Counts[outbox.StatusFailed])
	want("orders PENDING", ordersPending, stats[0].Counts[outbox.StatusPending])
	want("sms FAILED", smsFailed, stats[1].Counts[outbox.StatusFailed])
	want("dead-letter rows", deadRows, stats[0].Counts[outbox.StatusFailed]+stats[1].Counts[outbox.StatusFailed])
	if age, err := strconv.ParseFloat(ageSeconds, 64); err != nil || age < 0 || age > time.Hour.Seconds() {
		t.Errorf("oldest pending age of orders: %q, want the seconds since the fixture was built", ageSeconds)
	}
	if errText != "http_400: refused by the provider" {
		t.Errorf("the dead letter's error shows %q", errText)
	}
	if detailRows != "1" || detailOutcome != "FAILED" {
		t.Errorf("attempt history: %s rows, outcome %q; want 1 FAILED", detailRows, detailOutcome)
	}

	// Requeue from the page; the store shows the message PENDING, and the
	// page drops it from the dead letters.
	if f.status("", target.ID) != outbox.StatusFailed {
		t.Fatal("the target is not FAILED before the click")
	}
	err = chromedp.Do(ctx,
		chromedp.Click(css(`button.requeue[data-id="`+target.ID+`"]`)),
		chromedp.WaitNotPresent(css(`#dead tr[data-id="`+target.ID+`"]`)),
	)
	if err != nil {
		t.Fatalf("chromium: requeue: %v", err)
	}
	notice := text(`#notice`)
	if st := f.status("", target.ID); st != outbox.StatusPending {
		t.Fatalf("after the click the store shows %s, want PENDING", st)
	}
	if notice == "" {
		t.Error("the page confirmed nothing after the requeue")
	}
	for _, m := range []outbox.Message{f.dead[0], f.dead[2]} {
		if st := f.status("", m.ID); st != outbox.StatusFailed {
			t.Errorf("%s is %s: the click requeued more than its message", m.ID, st)
		}
	}

	// The dead letter that holds its group: marked, counted, found by the
	// filter, and a Cancel click releases its group.
	holdsText := text(`#dead tr[data-id="` + holding.ID + `"] td.blocking`)
	if holdsText != "holds g1" {
		t.Errorf("the holding dead letter shows %q in its Holds group cell, want %q", holdsText, "holds g1")
	}
	if got := text(`#blocking-count`); got != "1 dead letter holds its group" {
		t.Errorf("blocking count shows %q", got)
	}
	err = chromedp.Do(ctx,
		chromedp.Click(css(`#only-blocking`)),
		chromedp.WaitNotPresent(css(`#dead tr[data-id="`+f.dead[0].ID+`"]`)),
	)
	if err != nil {
		t.Fatalf("chromium: filter: %v", err)
	}
	if rows := eval(`String(document.querySelectorAll("#dead tbody tr").length)`); rows != "1" {
		t.Errorf("with the filter on the page lists %s dead letters, want the 1 that holds its group", rows)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`)); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	err = chromedp.Do(ctx,
		chromedp.Click(css(`button.cancel[data-id="`+holding.ID+`"]`)),
		chromedp.WaitNotPresent(css(`#dead tr[data-id="`+holding.ID+`"]`)),
	)
	if err != nil {
		t.Fatalf("chromium: cancel: %v", err)
	}
	if st := f.status("C", holding.ID); st != outbox.StatusCancelled {
		t.Fatalf("after the Cancel click the store shows %s, want CANCELLED", st)
	}
	if got := text(`#blocking-count`); got != "no group is held" {
		t.Errorf("after the cancel the blocking count shows %q", got)
	}
	// The group is released: its next message can be claimed.
	claimed, err := f.store.MessageClaim(f.ctx, outbox.MessageClaimParams{Limit: 10, Owner: "after-cancel", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	gotNext := false
	for _, m := range claimed {
		gotNext = gotNext || m.ID == next.ID
	}
	if !gotNext {
		t.Errorf("after the cancel a claim got %d messages, none of them group g1's next message %s", len(claimed), next.ID)
	}
}

// shared is the package's one headless Chromium: every browser test opens
// its tabs in it (newTab), so the browser starts once per run.
var shared struct {
	once  sync.Once
	ctx   context.Context
	close func()
	err   error
}

// TestMain closes the shared browser after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.close != nil {
		shared.close()
	}
	os.Exit(code)
}

// sharedBrowser returns the context of the shared Chromium, started by the
// first caller; tabs are contexts derived from it.
func sharedBrowser(t *testing.T) context.Context {
	t.Helper()
	exe := chromium(t)
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "outboxkit-chromium-")
		if err != nil {
			shared.err = err
			return
		}
		allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
			chromedp.ExecPath(exe),
			chromedp.Flag("headless", true),
			chromedp.NoSandbox,
			chromedp.DisableGPU,
			chromedp.Flag("disable-quic", true),
			chromedp.NoFirstRun,
			chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			chromedp.UserDataDir(dir),
		)
		ctx, cancel := chromedp.NewContext(allocCtx)
		shared.ctx = ctx
		shared.close = func() { cancel(); cancelAlloc(); os.RemoveAll(dir) }
		shared.err = chromedp.Do(ctx, chromedp.Navigate("about:blank"))
	})
	if shared.err != nil {
		t.Fatalf("chromium: start: %v", shared.err)
	}
	return shared.ctx
}

// open loads the dashboard at url with the operator token and waits until
// its first load is done.
func open(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": token}}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	err := chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`body[data-loaded="true"]`)),
	)
	if err != nil {
		t.Fatalf("chromium: load: %v", err)
	}
}

// blockingDeadLetter dead-letters a new message of (tenant, topic, group)
// under the block policy, then enqueues the group's next message, which
// the dead letter holds back.
func (f *fixture) blockingDeadLetter(tenant, topic, group string) (holding, next outbox.Message) {
	f.t.Helper()
	ob := outbox.New[*sql.Tx](f.store, outbox.Options{})
	enq := func(n int) outbox.Message {
		res, err := ob.Enqueue(f.ctx, outbox.Message{Tenant: tenant, Topic: topic, Group: group, Payload: json.RawMessage(fmt.Sprintf(`{"g":%d}`, n))})
		if err != nil {
			f.t.Fatal(err)
		}
		return res[0].Message
	}
	holding = enq(1)
	claimed, err := f.store.MessageClaim(f.ctx, outbox.MessageClaimParams{Limit: 10, Owner: "blocker", Now: time.Now()})
	if err != nil || len(claimed) != 1 || claimed[0].ID != holding.ID {
		f.t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	_, err = f.store.MessageFinish(f.ctx, outbox.MessageFinishParams{Owner: "blocker", Now: time.Now(), Outcomes: []outbox.Outcome{{
		Kind: outbox.OutcomeDead, ID: holding.ID, Topic: topic, Attempt: claimed[0].Attempts, ClaimToken: claimed[0].ClaimToken, BlockGroup: true,
		Error: &outbox.ErrorInfo{Code: "http_400", Message: "refused by the provider"}, StartedAt: time.Now(),
	}}})
	if err != nil {
		f.t.Fatal(err)
	}
	next = enq(2)
	if again, err := f.store.MessageClaim(f.ctx, outbox.MessageClaimParams{Limit: 10, Owner: "blocker", Now: time.Now()}); err != nil || len(again) != 0 {
		f.t.Fatalf("the held group's next message was claimed (%d, %v)", len(again), err)
	}
	return holding, next
}
