package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemoRun runs the program as a newcomer does (demo mode, SQLite, the
// fake Cloud API): the printed curl command's request reaches DELIVERED,
// then a shutdown signal (ctx) stops it cleanly.
func TestDemoRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuf{}
	done := make(chan error, 1)
	// Port 0: the program prints the address it listens on (a port picked
	// by the test and freed could be taken by another test meanwhile).
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-dsn", filepath.Join(t.TempDir(), "demo.db")}, func(string) string { return "" }, out)
	}()
	base := awaitOutput(t, out, done, regexp.MustCompile(`curl -s -X POST (http://\S+)/api/v1/outbound/messages`), 20*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := http.Get(base + "/readyz")
		if err == nil {
			_ = r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %v\n%s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	call := func(method, path, body string) map[string]any {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+demoKeys["org-1"])
		req.Header.Set("X-Org-Id", "org-1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || res.StatusCode >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
		}
		return m
	}
	m := call("POST", "/api/v1/outbound/messages", `{"dossierId":42,"channel":"WHATSAPP","to":"+33612345678","templateCode":"hello_world","payloadJson":{"language":"en_US"}}`)
	id, _ := m["id"].(string)
	for call("GET", "/api/v1/outbound/messages/"+id, "")["status"] != "DELIVERED" {
		if time.Now().After(deadline) {
			t.Fatalf("not delivered:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The printed dashboard opens with the demo admin token.
	if !strings.Contains(out.String(), "The outbox dashboard: "+base+"/admin/ (any user name, password "+demoAdminToken+")") {
		t.Errorf("no dashboard line printed:\n%s", out)
	}
	req, _ := http.NewRequest("GET", base+"/admin/api/stats", nil)
	req.SetBasicAuth("me", demoAdminToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Totals map[string]int64 `json:"totals"`
	}
	err = json.NewDecoder(res.Body).Decode(&stats)
	_ = res.Body.Close()
	if err != nil || res.StatusCode != 200 || stats.Totals["DELIVERED"] != 1 {
		t.Errorf("admin stats with the demo token: %d %+v %v", res.StatusCode, stats, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no clean shutdown")
	}
	for _, want := range []string{"message QUEUED", "message SENT", "message DELIVERED", "messaging-service stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
	for _, secret := range []string{demoKeys["org-2"]} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("the log shows a secret")
		}
	}
}

func TestParseRefusesMisconfiguration(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-graph-url", "https://graph.facebook.com"},
		{"-log-format", "xml"},
		{"-admin-token", "short"},
		{"extra"},
	} {
		if _, err := parse(args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	o, err := parse(nil, func(k string) string { return map[string]string{"MSGSVC_STORE": "postgres", "MSGSVC_ADDR": ":9"}[k] }, io.Discard)
	if err != nil || o.store != "postgres" || o.addr != ":9" {
		t.Errorf("env: %+v %v", o, err)
	}
}
