package service_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
)

const adminToken = "ops-token-0123456789abcdef"

// TestAdmin: with an admin token the service serves outboxkit's admin API
// and dashboard under /admin/, to the token only (as a bearer token, or as
// a Basic password, which a browser is asked for); it sees every
// organisation's messages, and on PostgreSQL the storage report. Without a
// token there is nothing there.
func TestAdmin(t *testing.T) {
	t.Parallel()
	for _, kind := range backends {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newDatabase(t, kind), nil, func(c *service.Config) { c.AdminToken = adminToken })
			e.consent("org-1", 7001, "GRANTED")
			m := e.create("org-1", sendBody(7001, "+33600007001"), http.StatusCreated)
			e.waitStatus("org-1", m.ID, "DELIVERED")

			get := func(path string, auth ...string) (*http.Response, []byte) {
				t.Helper()
				req, _ := http.NewRequest("GET", e.ts.URL+path, nil)
				switch {
				case len(auth) == 1:
					req.Header.Set("Authorization", auth[0])
				case len(auth) == 2:
					req.SetBasicAuth(auth[0], auth[1])
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				b, err := io.ReadAll(res.Body)
				if err != nil {
					t.Fatal(err)
				}
				return res, b
			}
			for _, auth := range [][]string{nil, {"Bearer " + key1}, {"Bearer " + adminToken + "x"}, {"ops", "wrong"}} {
				res, _ := get("/admin/api/stats", auth...)
				if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Basic ") {
					t.Errorf("stats with %q: %d, WWW-Authenticate %q; want 401 asking for Basic", auth, res.StatusCode, res.Header.Get("WWW-Authenticate"))
				}
			}
			res, body := get("/admin/api/stats", "Bearer "+adminToken)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("stats with the admin token: %d %s", res.StatusCode, body)
			}
			var stats struct {
				Totals  map[string]int64 `json:"totals"`
				Storage *struct {
					Tables []struct {
						Name string `json:"name"`
					} `json:"tables"`
				} `json:"storage"`
			}
			if err := json.Unmarshal(body, &stats); err != nil {
				t.Fatal(err)
			}
			if stats.Totals["DELIVERED"] < 1 {
				t.Errorf("admin stats %s: want the delivered message counted", body)
			}
			if (kind == "postgres") != (stats.Storage != nil) {
				t.Errorf("admin stats on %s: storage report %v", kind, stats.Storage)
			}
			res, body = get("/admin/", "ops", adminToken)
			if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "<title>outboxkit") {
				t.Errorf("dashboard with Basic authentication: %d %.200s", res.StatusCode, body)
			}
		})
	}
}

// TestAdminNotServedWithoutToken: no admin token, no admin API.
func TestAdminNotServedWithoutToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newDatabase(t, "sqlite"), nil, nil)
	r := e.do("GET", "/admin/api/stats", "", nil, "Authorization", "Bearer "+adminToken)
	if r.status != http.StatusNotFound {
		t.Errorf("GET /admin/api/stats without an admin token configured: %d, want 404", r.status)
	}
}
