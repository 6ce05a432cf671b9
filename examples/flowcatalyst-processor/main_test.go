package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

const minimal = "postgres://postgres@127.0.0.1:5432/app"

func TestLoadConfigDefaultsMirrorTheSeed(t *testing.T) {
	t.Parallel()
	c, err := loadConfig([]string{"-database-url", minimal, "-api-base-url", "https://fc.example.com"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := config{
		Enabled: true, PollInterval: time.Second, PollBatchSize: 500, APIBatchSize: 100, MaxConcurrentGroups: 10,
		GlobalBufferSize: 1000, DatabaseType: "POSTGRESQL", EventsTable: "outbox_events", DispatchJobsTable: "outbox_dispatch_jobs",
		MaxRetries: 3, ProcessingTimeoutSeconds: 300, MongoDatabase: "outbox", APIVersion: "current",
	}
	got := config{
		Enabled: c.Enabled, PollInterval: c.PollInterval, PollBatchSize: c.PollBatchSize, APIBatchSize: c.APIBatchSize,
		MaxConcurrentGroups: c.MaxConcurrentGroups, GlobalBufferSize: c.GlobalBufferSize, DatabaseType: c.DatabaseType,
		EventsTable: c.EventsTable, DispatchJobsTable: c.DispatchJobsTable, MaxRetries: c.MaxRetries,
		ProcessingTimeoutSeconds: c.ProcessingTimeoutSeconds, MongoDatabase: c.MongoDatabase, APIVersion: c.APIVersion,
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults\n got %+v\nwant %+v", got, want)
	}
	if c.api.DispatchJobsPath != "/api/dispatch-jobs/batch" || len(c.backoff) != 3 {
		t.Errorf("api %+v backoff %v", c.api, c.backoff)
	}
}

func TestLoadConfigEnvThenFlags(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{
		"OUTBOX_PROCESSOR_DATABASE_URL":    minimal,
		"OUTBOX_PROCESSOR_API_BASE_URL":    "https://fc.example.com",
		"OUTBOX_PROCESSOR_POLL_INTERVAL":   "PT0.5S", // the seed's ISO-8601 form
		"OUTBOX_PROCESSOR_MAX_RETRIES":     "5",
		"OUTBOX_PROCESSOR_API_VERSION":     "seed",
		"OUTBOX_PROCESSOR_API_BATCH_SIZE":  "50",
		"OUTBOX_PROCESSOR_ENABLED":         "false",
		"OUTBOX_PROCESSOR_EVENTS_TABLE":    "app.outbox_events",
		"OUTBOX_PROCESSOR_RETRY_BACKOFF":   "1s, 10s",
		"OUTBOX_PROCESSOR_CREATE_TABLES":   "true",
		"OUTBOX_PROCESSOR_API_TOKEN":       "from-env",
		"OUTBOX_PROCESSOR_LOG_FORMAT":      "text",
		"OUTBOX_PROCESSOR_MONGO_DATABASE":  "ignored",
		"OUTBOX_PROCESSOR_DISPATCH_JOBS_T": "typo is ignored",
	})
	c, err := loadConfig([]string{"-max-retries", "7", "-enabled"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.PollInterval != 500*time.Millisecond || c.MaxRetries != 7 || !c.Enabled || c.APIBatchSize != 50 ||
		c.api.DispatchJobsPath != "/api/dispatch/jobs/batch" || c.EventsTable != "app.outbox_events" ||
		fmt.Sprint(c.backoff) != "[1s 10s]" || !c.CreateTables || c.APIToken != "from-env" {
		t.Errorf("config %+v", c)
	}
}

func TestLoadConfigReportsEveryProblem(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{"OUTBOX_PROCESSOR_POLL_BATCH_SIZE": "lots"})
	_, err := loadConfig([]string{
		"-api-version", "v9", "-api-batch-size", "0", "-database-type", "ORACLE", "-max-retries", "-1",
		"-api-token", "t", "-api-token-url", "https://x/oauth/token", "-retry-backoff", "1s,soon", "-log-level", "loud",
		"-processing-timeout-seconds", "20", "-drain-timeout", "30s",
	}, e, &bytes.Buffer{})
	if err == nil {
		t.Fatal("invalid configuration accepted")
	}
	for _, want := range []string{
		"OUTBOX_PROCESSOR_POLL_BATCH_SIZE: \"lots\" is not a whole number",
		"database-url (-database-url or OUTBOX_PROCESSOR_DATABASE_URL) is required",
		"api-base-url (-api-base-url or OUTBOX_PROCESSOR_API_BASE_URL) is required",
		"api-version (-api-version or OUTBOX_PROCESSOR_API_VERSION) must be current or seed",
		"api-batch-size (-api-batch-size or OUTBOX_PROCESSOR_API_BATCH_SIZE) must be positive",
		"max-retries (-max-retries or OUTBOX_PROCESSOR_MAX_RETRIES) must be between 0 and 999",
		`database-type (-database-type or OUTBOX_PROCESSOR_DATABASE_TYPE) must be POSTGRESQL, MYSQL or MONGODB, got "ORACLE"`,
		"set either api-token",
		"api-client-id (-api-client-id or OUTBOX_PROCESSOR_API_CLIENT_ID) is required with api-token-url",
		"retry-backoff",
		"log-level",
		"drain-timeout (-drain-timeout or OUTBOX_PROCESSOR_DRAIN_TIMEOUT) (30s) must be shorter than processing-timeout-seconds",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	_, err = loadConfig([]string{"-database-url", minimal, "-api-base-url", "https://x", "-api-version", "seed", "-api-batch-size", "500"}, env(nil), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "accepts at most 100 items") {
		t.Errorf("seed API with 500 items per request: %v", err)
	}
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if code := run(context.Background(), []string{"-poll-interval", "0s"}, env(nil), &out); code != 2 {
		t.Errorf("invalid config: exit %d, want 2", code)
	}
	if !strings.Contains(out.String(), "invalid configuration") {
		t.Errorf("stderr %q", out.String())
	}
	// Every configuration problem, flags included, exits 2 before any
	// connection, each listed, with no usage dump.
	out.Reset()
	code := run(context.Background(), []string{
		"-database-url", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", "-api-base-url", "https://x",
		"-events-table", "x;drop", "-poll-batch-size", "many", "-no-such-flag", "-max-retries", "-1",
	}, env(map[string]string{"OUTBOX_PROCESSOR_DISPATCH_JOBS_TABLE": "x;drop"}), &out)
	if code != 2 {
		t.Errorf("invalid tables and flags: exit %d, want 2:\n%s", code, out.String())
	}
	for _, want := range []string{
		`events-table (-events-table or OUTBOX_PROCESSOR_EVENTS_TABLE) is "x;drop"`,
		`dispatch-jobs-table (-dispatch-jobs-table or OUTBOX_PROCESSOR_DISPATCH_JOBS_TABLE) is "x;drop"`,
		"must differ",
		`-poll-batch-size: "many" is not a whole number`,
		"flag provided but not defined: -no-such-flag",
		"max-retries (-max-retries or OUTBOX_PROCESSOR_MAX_RETRIES) must be between 0 and 999",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "connecting") || strings.Contains(out.String(), "Usage") {
		t.Errorf("output connects or dumps the usage:\n%s", out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"-database-url", minimal, "-api-base-url", "https://x", "-events-table", "a.t", "-dispatch-jobs-table", "A.T"}, env(nil), &out); code != 2 || !strings.Contains(out.String(), "must differ") {
		t.Errorf("equal tables: exit %d:\n%s", code, out.String())
	}
	if code := run(context.Background(), []string{"-h"}, env(nil), &bytes.Buffer{}); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
	// Disabled: idles until stopped, then exits 0.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	out.Reset()
	if code := run(ctx, []string{"-enabled=false", "-database-url", minimal, "-api-base-url", "https://x"}, env(nil), &out); code != 0 || !strings.Contains(out.String(), "disabled") {
		t.Errorf("disabled: exit %d, log %q", code, out.String())
	}
	// Unreachable database: exit 1 with a message.
	out.Reset()
	if code := run(context.Background(), []string{"-database-url", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", "-api-base-url", "https://x"}, env(nil), &out); code != 1 || !strings.Contains(out.String(), "connecting to the database") {
		t.Errorf("no database: exit %d, log %q", code, out.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestProcessorEndToEnd(t *testing.T) {
	t.Parallel()
	dsn, why := testbackend.Lookup("OUTBOXKIT_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "127.0.0.1:5432")
	if dsn == "" {
		testbackend.Unavailable(t, "PostgreSQL", why)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Ping(); err != nil {
		testbackend.Unavailable(t, "PostgreSQL", err.Error())
	}
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	schema := "fcproc_" + hex.EncodeToString(rb[:])
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP SCHEMA " + schema + " CASCADE") //nolint:errcheck

	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	const secret = "oauth-client-secret-xyz"
	tokenURL := srv.EnableOAuth("processor", secret, time.Hour)
	// The first request carrying the flaky job fails as a whole.
	var flaky sync.Once
	srv.OnRequest(func(r *flowcatalysttest.Request) *flowcatalysttest.Response {
		var fail bool
		if bytes.Contains(r.Body, []byte(`"flaky":true`)) {
			flaky.Do(func() { fail = true })
		}
		if fail {
			return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"try later"}`)}
		}
		return nil
	})
	srv.OnItem(func(_ *flowcatalysttest.Request, _ int, it json.RawMessage) flowcatalyst.ItemResult {
		if bytes.Contains(it, []byte(`"bad":true`)) {
			return flowcatalyst.ItemResult{Status: flowcatalyst.ItemBadRequest, Error: "targetUrl is required"}
		}
		return flowcatalyst.ItemResult{}
	})

	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{
			"-create-tables", "-poll-interval", "50ms", "-api-batch-size", "5", "-retry-backoff", "50ms",
			"-events-table", schema + ".outbox_events", "-dispatch-jobs-table", schema + ".outbox_dispatch_jobs",
			"-single-active",
		}, env(map[string]string{
			"OUTBOX_PROCESSOR_DATABASE_URL":      dsn,
			"OUTBOX_PROCESSOR_API_BASE_URL":      srv.URL,
			"OUTBOX_PROCESSOR_API_TOKEN_URL":     tokenURL,
			"OUTBOX_PROCESSOR_API_CLIENT_ID":     "processor",
			"OUTBOX_PROCESSOR_API_CLIENT_SECRET": secret,
		}), &logs)
	}()

	// The application writes rows by plain SQL, once the tables exist.
	waitFor(t, "the tables", func() bool {
		var ok bool
		_ = db.QueryRow(`SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`, schema+".outbox_events", schema+".outbox_dispatch_jobs").Scan(&ok)
		return ok
	})
	base := time.Now().UTC().Add(-time.Minute)
	for i := range 12 {
		id := flowcatalyst.NewTSID().String()
		payload := fmt.Sprintf(`{"type":"order.created","source":"shop","data":{"n":%d}}`, i)
		if _, err := db.Exec(`INSERT INTO `+schema+`.outbox_events (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, 'EVENT', 'order-7', $2, 'PENDING', 0, $3)`, id, payload, base.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	badID := flowcatalyst.NewTSID().String()
	if _, err := db.Exec(`INSERT INTO `+schema+`.outbox_dispatch_jobs (id, type, payload, status, retry_count, created_at)
VALUES ($1, 'DISPATCH_JOB', '{"bad":true}', 'PENDING', 0, now())`, badID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO `+schema+`.outbox_dispatch_jobs (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, 'DISPATCH_JOB', 'f', '{"flaky":true}', 'PENDING', 0, now())`, flowcatalyst.NewTSID().String()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rows processed", func() bool {
		var completed, failed, jobsDone int
		_ = db.QueryRow(`SELECT count(*) FROM ` + schema + `.outbox_events WHERE status = 'COMPLETED'`).Scan(&completed)
		_ = db.QueryRow(`SELECT count(*) FROM ` + schema + `.outbox_dispatch_jobs WHERE status = 'FAILED'`).Scan(&failed)
		_ = db.QueryRow(`SELECT count(*) FROM ` + schema + `.outbox_dispatch_jobs WHERE status = 'COMPLETED' AND retry_count = 1`).Scan(&jobsDone)
		return completed == 12 && failed == 1 && jobsDone == 1
	})
	var errMsg string
	_ = db.QueryRow(`SELECT error_message FROM `+schema+`.outbox_dispatch_jobs WHERE id = $1`, badID).Scan(&errMsg)
	if !strings.Contains(errMsg, "targetUrl is required") {
		t.Errorf("error_message %q", errMsg)
	}
	// FIFO within the group.
	for i, it := range srv.Items(flowcatalyst.CurrentAPI.EventsPath) {
		if !bytes.Contains(it, []byte(fmt.Sprintf(`"n":%d}`, i))) {
			t.Errorf("event %d is %s", i, it)
		}
	}
	cancel() // as SIGTERM does
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d; logs:\n%s", code, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the processor did not stop")
	}
	out := logs.String()
	for _, want := range []string{`"msg":"flowcatalyst outbox processor starting"`, `"auth":"oauth2-client-credentials"`, `single-active: this processor is now the active one`, `"msg":"flowcatalyst outbox processor stopped cleanly"`,
		// At the default level: the failed request, the retry, the FAILED row.
		`"level":"WARN","msg":"flowcatalyst request failed"`, `"status":503`, `"level":"WARN","msg":"row will be retried"`, `"level":"ERROR","msg":"row FAILED"`, `"id":"` + badID + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, secret) {
		t.Error("the client secret is in the logs")
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON: %s", line)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func TestLoadConfigMySQL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"mysql://app:s3cret@db.example.com/shop?tls=skip-verify": "app:s3cret@tcp(db.example.com:3306)/shop?",
		"app:s3cret@tcp(db:3307)/shop":                           "app:s3cret@tcp(db:3307)/shop?",
	} {
		c, err := loadConfig([]string{"-database-type", "MYSQL", "-database-url", in, "-api-base-url", "https://x"}, env(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if !c.mysql || !strings.HasPrefix(c.mysqlDSN, want) || !strings.Contains(c.mysqlDSN, "parseTime=true") ||
			!strings.Contains(c.mysqlDSN, "time_zone=") {
			t.Errorf("%s: DSN %q, want %s... with parseTime and time_zone", in, c.mysqlDSN, want)
		}
	}
	for _, bad := range []string{minimal, "mysql://:pw@/nodb", "s3cret garbage"} {
		_, err := loadConfig([]string{"-database-type", "MYSQL", "-database-url", bad, "-api-base-url", "https://x"}, env(nil), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "must be a mysql:// URL or a MySQL DSN") {
			t.Errorf("%s: %v, want the MySQL database-url problem", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the error repeats the database URL: %v", err)
		}
	}
}

func TestLoadConfigMongo(t *testing.T) {
	t.Parallel()
	c, err := loadConfig([]string{"-database-type", "MONGODB", "-database-url", "mongodb://app:s3cret@db:27017/?replicaSet=rs0",
		"-api-base-url", "https://x", "-mongo-database", "shop", "-events-table", "events.v1"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.mongo || c.mysql || c.MongoDatabase != "shop" || c.EventsTable != "events.v1" {
		t.Errorf("config %+v", c)
	}
	// Every problem at once, none repeating the URL.
	_, err = loadConfig([]string{"-database-type", "MONGODB", "-database-url", "postgres://app:s3cret@db/x", "-api-base-url", "https://x",
		"-mongo-database", "a/b", "-events-table", "$bad", "-dispatch-jobs-table", "outbox_processor_locks"}, env(nil), &bytes.Buffer{})
	for _, want := range []string{
		"database-url (-database-url or OUTBOX_PROCESSOR_DATABASE_URL) must be a mongodb:// or mongodb+srv:// URL",
		`mongo-database (-mongo-database or OUTBOX_PROCESSOR_MONGO_DATABASE) is "a/b"`,
		`events-table (-events-table or OUTBOX_PROCESSOR_EVENTS_TABLE) is "$bad"`,
		`dispatch-jobs-table (-dispatch-jobs-table or OUTBOX_PROCESSOR_DISPATCH_JOBS_TABLE) is "outbox_processor_locks"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if err != nil && strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error repeats the database URL: %v", err)
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"-database-type", "MONGODB", "-database-url", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=500",
		"-api-base-url", "https://x"}, env(nil), &out); code != 1 || !strings.Contains(out.String(), "connecting to the database") {
		t.Errorf("no MongoDB server: exit %d, log %q", code, out.String())
	}
}
