package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox/admin"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// pgStore returns a migrated PostgreSQL store in a fresh schema, and a
// context for the test.
func pgStore(t *testing.T) (testbackend.PostgresSchema, *postgres.Store, context.Context) {
	t.Helper()
	pg := testbackend.Postgres(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pg, st, ctx
}

// TestStatsCarryTheStorageReport: on a store that reports its storage
// (PostgreSQL), GET api/stats carries each of its tables and the cleanup
// horizon, and names the session whose open transaction holds it back.
func TestStatsCarryTheStorageReport(t *testing.T) {
	t.Parallel()
	pg, st, ctx := pgStore(t)
	h, err := admin.New(admin.Config{Store: st, Authorize: authorize})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	pg.HoldHorizon(t, 3)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/stats", nil)
	req.Header.Set("Authorization", token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var stats admin.Stats
	if err := json.NewDecoder(res.Body).Decode(&stats); err != nil || res.StatusCode != 200 {
		t.Fatalf("stats: %d, %v", res.StatusCode, err)
	}
	if stats.Storage == nil {
		t.Fatal("no storage report")
	}
	found := false
	for _, tb := range stats.Storage.Tables {
		found = found || tb.Name == st.MessagesTable()
	}
	if !found {
		t.Errorf("storage tables %+v, want %s among them", stats.Storage.Tables, st.MessagesTable())
	}
	if stats.Storage.Horizon.AgeTransactions < 3 || stats.Storage.Horizon.Holder == "" {
		t.Errorf("horizon %+v with a transaction open for 3 others, want an age of 3 or more and its holder", stats.Storage.Horizon)
	}
}

// TestDashboardStorageInChromium: on PostgreSQL the dashboard shows the
// storage report: the messages table with its live rows, and the session
// whose open transaction holds the cleanup back.
func TestDashboardStorageInChromium(t *testing.T) {
	t.Parallel()
	bctx := newTab(t, sharedBrowser(t), false).ctx
	pg, st, ctx := pgStore(t)
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+st.MessagesTable()+` (id, tenant, topic, grp, idempotency_key, status, next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, '', 't', '', 'm' || i, 'PENDING', now(), now(), now(), '{}'::json FROM generate_series(1, 50) AS i`); err != nil {
		t.Fatal(err)
	}
	// The statistics count the rows once analysed (the insert's own report
	// may come up to 10 s later).
	if _, err := pg.Pool.Exec(ctx, `ANALYZE `+st.MessagesTable()); err != nil {
		t.Fatal(err)
	}
	h, err := admin.New(admin.Config{Store: st, Authorize: authorize})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	pg.HoldHorizon(t, 0)

	open(t, bctx, srv.URL+"/ops/")
	hidden, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById("storage").hidden`))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	live, err := chromedp.Run(bctx, chromedp.Evaluate[string](`(document.querySelector('#storage-tables tr[data-table="`+st.MessagesTable()+`"] td[data-live]') || {}).textContent || ""`))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	horizon, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#horizon`)))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if hidden {
		t.Fatal("the storage section is hidden on PostgreSQL")
	}
	if live != "50" {
		t.Errorf("the messages table shows %q live rows, want 50", live)
	}
	if !strings.Contains(horizon, "held by session") {
		t.Errorf("the horizon line reads %q with a transaction open, want it to name the session", horizon)
	}
}
