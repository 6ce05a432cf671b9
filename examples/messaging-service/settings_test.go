package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/examples/messaging-service/fakewa"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// started runs the program with args and env until the test ends and
// returns its base URL (from its log).
func started(t *testing.T, args []string, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuf{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), func(k string) string { return env[k] }, out)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("no clean shutdown")
		}
	})
	return awaitOutput(t, out, done, regexp.MustCompile(`messaging-service listening" url=(http://\S+)`), 30*time.Second)
}

// awaitOutput waits until the program's output matches re and returns the
// first submatch; it fails if the program ends or nothing matches in time.
func awaitOutput(t *testing.T, out *syncBuf, done <-chan error, re *regexp.Regexp, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case err := <-done:
			t.Fatalf("the program ended before printing %q: %v\n%s", re, err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q printed within %s:\n%s", re, within, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func call(t *testing.T, method, url, key, org, body string) (int, map[string]any, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Org-Id", org)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return res.StatusCode, m, b
}

// TestSettings: the processor's settings (the seed's outbound.worker.*) and
// a deployment's error classes come from flags and MSGSVC_* variables, on
// each store, with the real Cloud API's configuration (an organisations
// file and -graph-url; here the fake's URL): 3 attempts at 250 ms instead
// of 5 over hours, and 131026 retried instead of failed at once.
func TestSettings(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			args := []string{"-store", kind}
			switch kind {
			case "postgres":
				pg := testbackend.Postgres(t, 2)
				args = append(args, "-dsn", pg.DSN, "-pg-schema", pg.Name)
			case "mysql":
				args = append(args, "-dsn", testbackend.MySQL(t, 2).DSN)
			default:
				args = append(args, "-dsn", filepath.Join(t.TempDir(), "settings.db"))
			}
			const phone, token, secret, key = "300000000000001", "token-settings", "secret-settings", "settings-key-0123456789"
			fake, err := fakewa.Start("127.0.0.1:0", fakewa.Config{Phones: map[string]fakewa.Phone{phone: {AccessToken: token, AppSecret: secret}}, ReceiptDelay: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fake.Close() })
			orgs := fmt.Sprintf(`[{"id":"org-s","apiKey":%q,"whatsapp":{"PhoneNumberID":%q,"AccessToken":%q,"AppSecret":%q}}]`, key, phone, token, secret)
			orgsFile := filepath.Join(t.TempDir(), "orgs.json")
			if err := os.WriteFile(orgsFile, []byte(orgs), 0o600); err != nil {
				t.Fatal(err)
			}
			args = append(args, "-orgs", orgsFile, "-graph-url", fake.URL(), "-backoff", "250ms", "-poll-interval", "100ms",
				"-batch-size", "10", "-stale-timeout", "30s", "-error-classes", "131026=retryable")
			base := started(t, args, map[string]string{"MSGSVC_MAX_ATTEMPTS": "3", "MSGSVC_DRAIN_TIMEOUT": "2s", "MSGSVC_LOG_FORMAT": "text"})
			fake.SetWebhookURL(base + "/api/v1/webhooks/whatsapp/inbound")

			if st, _, b := call(t, "POST", base+"/api/v1/dossiers/9/consents", key, "org-s", `{"channel":"WHATSAPP","status":"GRANTED"}`); st != 201 {
				t.Fatalf("consent: %d %s", st, b)
			}
			fake.FailRecipient("+33600000900", 131026)
			st, m, b := call(t, "POST", base+"/api/v1/outbound/messages", key, "org-s",
				`{"dossierId":9,"channel":"WHATSAPP","to":"+33600000900","templateCode":"t","payloadJson":{"language":"en"}}`)
			if st != 201 || m["maxAttempts"] != 3.0 {
				t.Fatalf("create: %d %s, want maxAttempts 3", st, b)
			}
			id := m["id"].(string)
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, m, b = call(t, "GET", base+"/api/v1/outbound/messages/"+id, key, "org-s", "")
				if m["status"] == "FAILED" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not FAILED after 3 quick attempts: %s", b)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if m["attemptCount"] != 3.0 || m["errorCode"] != "131026" {
				t.Errorf("failed message %s: want 3 attempts of 131026 (retryable here)", b)
			}
			_, _, b = call(t, "GET", base+"/api/v1/outbound/messages/"+id+"/attempts", key, "org-s", "")
			var as []struct {
				NextRetryAt *time.Time
				UpdatedAt   time.Time
			}
			if err := json.Unmarshal(b, &as); err != nil || len(as) != 3 || as[0].NextRetryAt == nil ||
				as[0].NextRetryAt.Sub(as[0].UpdatedAt) > time.Second || as[2].NextRetryAt != nil {
				t.Errorf("attempts %s: want 3, retried 250 ms apart", b)
			}
		})
	}
}

func TestSettingsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-backoff", "1m,soon"}, nil},
		{[]string{"-backoff", "-1s"}, nil},
		{[]string{"-error-classes", "131026=sometimes"}, nil},
		{[]string{"-max-attempts", "-1"}, nil},
		{nil, map[string]string{"MSGSVC_POLL_INTERVAL": "fast"}},
		{nil, map[string]string{"MSGSVC_MAX_ATTEMPTS": "many"}},
		{nil, map[string]string{"MSGSVC_BACKOFF": "1m,x"}},
		{nil, map[string]string{"MSGSVC_ERROR_CLASSES": "x=y"}},
		{nil, map[string]string{"MSGSVC_METRICS": "perhaps"}},
	} {
		if _, err := parse(c.args, func(k string) string { return c.env[k] }, io.Discard); err == nil {
			t.Errorf("%v %v: no error", c.args, c.env)
		}
	}
	o, err := parse([]string{"-poll-interval", "2s"}, func(k string) string {
		return map[string]string{"MSGSVC_POLL_INTERVAL": "5s", "MSGSVC_BACKOFF": "1s,2s", "MSGSVC_BATCH_SIZE": "10", "MSGSVC_STALE_TIMEOUT": "1m", "MSGSVC_METRICS": "false"}[k]
	}, io.Discard)
	if err != nil || o.pollInterval != 2*time.Second || len(o.backoff) != 2 || o.backoff[1] != 2*time.Second || o.batchSize != 10 || o.staleTimeout != time.Minute || o.metrics {
		t.Errorf("flags over variables: %+v %v", o, err)
	}
}

// TestDefaultDatabaseOutsideTheWorkingDirectory: with no -dsn the SQLite
// file goes to the user's cache directory, not the working directory (a
// run from a source checkout would leave it in the repository).
func TestDefaultDatabaseOutsideTheWorkingDirectory(t *testing.T) {
	t.Parallel()
	const inCwd = "messaging-service.db"
	_, err := os.Stat(inCwd)
	existed := err == nil
	cache := t.TempDir()
	base := started(t, nil, map[string]string{"XDG_CACHE_HOME": cache})
	res, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("readyz: %d", res.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(cache, "outboxkit", "messaging-service.db")); err != nil {
		t.Errorf("the default database is not in the cache directory: %v", err)
	}
	if _, err := os.Stat(inCwd); err == nil && !existed {
		_ = os.Remove(inCwd)
		_ = os.Remove(inCwd + "-wal")
		_ = os.Remove(inCwd + "-shm")
		t.Errorf("the default database was created in the working directory")
	}
}
