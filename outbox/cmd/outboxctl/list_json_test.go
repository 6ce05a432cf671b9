package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// TestListJSONIsTheAdminShape: `list --json` prints JSON lines only (the
// paging hint goes to stderr), each message exactly as the admin API's
// GET api/messages shapes it: snake_case names, a JSON payload as JSON,
// other payloads in payload_base64, times a message has not reached
// omitted.
func TestListJSONIsTheAdminShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "json.db")
	url := "sqlite://" + path
	mustCtl(t, "migrate", "up", "--url", url)
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	for _, m := range []outbox.Message{
		{Tenant: "A", Topic: "orders", Group: "g1", Payload: json.RawMessage(`{"order":1}`), Headers: map[string]string{"k": "v"}},
		{Topic: "sms", ContentType: "text/plain", Payload: []byte("hello")},
		{Topic: "orders", Payload: json.RawMessage(`[1,2]`)},
	} {
		if _, err := ob.Enqueue(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	code, out, errOut := ctl(t, "list", "--url", url, "--json", "--limit", "2")
	if code != 0 {
		t.Fatalf("list --json: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("list --json --limit 2 printed %d lines, want 2 JSON lines:\n%s", len(lines), out)
	}
	if !strings.Contains(errOut, "next: --after-seq ") {
		t.Errorf("the paging hint is not on stderr: %q", errOut)
	}

	h, err := admin.New(admin.Config{Store: st, Authorize: func(*http.Request) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/messages?limit=2", nil))
	var page struct{ Messages []json.RawMessage }
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.Messages) != 2 {
		t.Fatalf("admin API: %v, %s", err, rec.Body)
	}
	for i, line := range lines {
		var fromCLI map[string]any
		if err := json.Unmarshal([]byte(line), &fromCLI); err != nil {
			t.Fatalf("line %d is not JSON: %v: %q", i, err, line)
		}
		var compactAPI bytes.Buffer
		if err := json.Compact(&compactAPI, page.Messages[i]); err != nil {
			t.Fatal(err)
		}
		if line != compactAPI.String() {
			t.Errorf("message %d:\nlist --json: %s\nadmin API:   %s", i, line, compactAPI.String())
		}
		for _, goName := range []string{"ID", "Tenant", "Payload", "CreatedAt"} {
			if _, ok := fromCLI[goName]; ok {
				t.Errorf("line %d has the Go field name %q: %s", i, goName, line)
			}
		}
	}
	if !strings.Contains(lines[0], `"payload":{"order":1}`) || !strings.Contains(lines[1], `"payload_base64":"aGVsbG8="`) {
		t.Errorf("payloads: a JSON payload is not JSON or a text payload is not base64:\n%s", out)
	}
	if strings.Contains(out, "0001-01-01") || strings.Contains(out, `"sent_at"`) {
		t.Errorf("times a PENDING message has not reached are printed:\n%s", out)
	}
}
