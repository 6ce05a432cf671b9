package main

import (
	"bytes"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// The end-to-end tests run the program as a real child process (built
// once) against PostgreSQL or MariaDB/MySQL and the fake FlowCatalyst over HTTP; the rows
// are written by plain SQL, as an application in any language would.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func buildProgram(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fcproc-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "flowcatalyst-processor")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

type e2e struct {
	db     *sql.DB
	dsn    string
	schema string
	srv    *flowcatalysttest.Server
	mysql  bool // database-type MYSQL; statements use ? placeholders
	mongo  *mongo.Database
}

func setupE2E(t *testing.T) *e2e {
	t.Helper()
	dsn, why := testbackend.Lookup("OUTBOXKIT_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "127.0.0.1:5432")
	if dsn == "" {
		testbackend.Unavailable(t, "PostgreSQL", why)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		testbackend.Unavailable(t, "PostgreSQL", err.Error())
	}
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	e := &e2e{db: db, dsn: dsn, schema: "fce2e_" + hex.EncodeToString(rb[:]), srv: flowcatalysttest.NewServer()}
	t.Cleanup(func() {
		e.srv.Close()
		_, _ = db.Exec("DROP SCHEMA " + e.schema + " CASCADE")
		_ = db.Close()
	})
	ddl := `CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.outbox_events (id VARCHAR(13) PRIMARY KEY, type VARCHAR(20) NOT NULL, message_group VARCHAR(255),
    payload TEXT NOT NULL, status VARCHAR(20) NOT NULL, retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL, processed_at TIMESTAMP, error_message TEXT);
CREATE INDEX ON %[1]s.outbox_events(status, message_group, created_at);
CREATE TABLE %[1]s.outbox_dispatch_jobs (id VARCHAR(13) PRIMARY KEY, type VARCHAR(20) NOT NULL, message_group VARCHAR(255),
    payload TEXT NOT NULL, status VARCHAR(20) NOT NULL, retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL, processed_at TIMESTAMP, error_message TEXT);
CREATE INDEX ON %[1]s.outbox_dispatch_jobs(status, message_group, created_at)`
	if _, err := db.Exec(fmt.Sprintf(ddl, e.schema)); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *e2e) table(topic string) string {
	if e.mongo != nil {
		if topic == "DISPATCH_JOB" {
			return "outbox_dispatch_jobs"
		}
		return "outbox_events"
	}
	if topic == "DISPATCH_JOB" {
		return e.schema + ".outbox_dispatch_jobs"
	}
	return e.schema + ".outbox_events"
}

// insert writes n rows per group into topic's table, ids prefix+i.
func (e *e2e) insert(t *testing.T, topic, prefix string, groups, n int) {
	t.Helper()
	if e.mongo != nil {
		e.insertMongo(t, topic, prefix, groups, n)
		return
	}
	if e.mysql {
		e.insertMySQL(t, e.db, topic, prefix, groups, n)
		return
	}
	if _, err := e.db.Exec(`INSERT INTO `+e.table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
SELECT $1::text || i, $2::text, 'g' || (i % $3::int), '{"topic":"' || $2::text || '","group":"g' || (i % $3::int) || '","n":' || i || '}', 'PENDING', 0,
	now() AT TIME ZONE 'UTC' - interval '1 hour' + i * interval '1 millisecond'
FROM generate_series(1, $4::int) AS i`, prefix, topic, groups, n); err != nil {
		t.Fatal(err)
	}
}

func (e *e2e) count(t *testing.T, topic, status string) int {
	t.Helper()
	if e.mongo != nil {
		return e.countMongo(t, topic, bson.D{{Key: "status", Value: status}})
	}
	var n int
	q := `SELECT count(*) FROM ` + e.table(topic) + ` WHERE status = $1`
	if e.mysql {
		q = strings.Replace(q, "$1", "?", 1)
	}
	if err := e.db.QueryRow(q, status).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// start runs the program; its logs go to the returned buffer.
func (e *e2e) start(t *testing.T, extra ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	args := append([]string{
		"-database-url", e.dsn, "-api-base-url", e.srv.URL, "-poll-interval", "100ms", "-retry-backoff", "50ms",
		"-events-table", e.table("EVENT"), "-dispatch-jobs-table", e.table("DISPATCH_JOB"), "-drain-timeout", "5s",
	}, extra...)
	if e.mysql {
		args = append(args, "-database-type", "MYSQL")
	}
	if e.mongo != nil {
		args = append(args, "-database-type", "MONGODB", "-mongo-database", e.mongo.Name())
	}
	cmd := exec.Command(buildProgram(t), args...)
	var logs syncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			t.Logf("the program's last log lines:\n%s", strings.Join(lines[max(0, len(lines)-25):], "\n"))
		}
	})
	return cmd, &logs
}

// stop sends SIGTERM and expects a clean exit.
func stop(t *testing.T, cmd *exec.Cmd, logs *syncBuffer) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("no exit 30 s after SIGTERM")
	}
}

func waitLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(180 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkStored asserts every row of topic was stored at least once (exactly
// once when exact) and, per group, first stored in created_at order.
func checkStored(t *testing.T, stored []json.RawMessage, groups, n int, exact bool) {
	t.Helper()
	seen := map[int]int{}
	last := map[string]int{}
	for _, raw := range stored {
		var it struct {
			Group string `json:"group"`
			N     int    `json:"n"`
		}
		if err := json.Unmarshal(raw, &it); err != nil {
			t.Fatalf("stored %s: %v", raw, err)
		}
		seen[it.N]++
		if seen[it.N] > 1 {
			if exact {
				t.Errorf("row %d stored %d times", it.N, seen[it.N])
			}
			continue
		}
		if it.N < last[it.Group] {
			t.Errorf("group %s: row %d first stored after row %d", it.Group, it.N, last[it.Group])
		}
		last[it.Group] = it.N
	}
	if len(seen) != n {
		t.Errorf("%d distinct rows stored, want %d", len(seen), n)
	}
}

func TestEndToEndIDsSharedAcrossTables(t *testing.T) {
	t.Parallel()
	testIDsSharedAcrossTables(t, setupE2E(t))
}

func testIDsSharedAcrossTables(t *testing.T, e *e2e, extra ...string) {
	e.srv.OnRequest(func(r *flowcatalysttest.Request) *flowcatalysttest.Response {
		if r.Path == flowcatalyst.CurrentAPI.EventsPath {
			return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"events down"}`)}
		}
		return nil
	})
	e.insert(t, "EVENT", "P", 4, 20)
	e.insert(t, "DISPATCH_JOB", "P", 4, 20)
	cmd, logs := e.start(t, append([]string{"-api-batch-size", "5"}, extra...)...)
	waitLong(t, "every row finished", func() bool {
		return e.count(t, "EVENT", "FAILED") == 20 && e.count(t, "DISPATCH_JOB", "COMPLETED") == 20
	})
	stop(t, cmd, logs)
	if n := len(e.srv.Items(flowcatalyst.CurrentAPI.EventsPath)); n != 0 {
		t.Errorf("%d events stored, want none", n)
	}
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.DispatchJobsPath), 4, 20, true)
}

func TestEndToEndTwoReplicas(t *testing.T) {
	t.Parallel()
	e := setupE2E(t)
	e.srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		return &flowcatalysttest.Response{Delay: 2 * time.Millisecond, Continue: true}
	})
	e.insert(t, "EVENT", "E", 20, 1000)
	a, la := e.start(t, "-api-batch-size", "10", "-poll-batch-size", "100")
	b, lb := e.start(t, "-api-batch-size", "10", "-poll-batch-size", "100")
	waitLong(t, "every row COMPLETED", func() bool { return e.count(t, "EVENT", "COMPLETED") == 1000 })
	stop(t, a, la)
	stop(t, b, lb)
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.EventsPath), 20, 1000, true)
	if !bytes.Contains([]byte(la.String()), []byte("starting")) || !bytes.Contains([]byte(lb.String()), []byte("starting")) {
		t.Errorf("a replica did not start:\n%s\n%s", la.String(), lb.String())
	}
}

func TestEndToEndKillAndRestart(t *testing.T) {
	t.Parallel()
	testKillAndRestart(t, setupE2E(t), 1000, 2)
}

// testKillAndRestart inserts n rows in 10 groups, kills the program with
// SIGKILL once a tenth is COMPLETED, restarts it with
// processing-timeout-seconds timeout and expects every row COMPLETED, none
// lost, none charged a retry.
func testKillAndRestart(t *testing.T, e *e2e, n, timeout int) {
	e.srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		return &flowcatalysttest.Response{Delay: 20 * time.Millisecond, Continue: true}
	})
	e.insert(t, "EVENT", "K", 10, n)
	args := []string{"-api-batch-size", "10", "-processing-timeout-seconds", fmt.Sprint(timeout), "-recovery-interval", "300ms", "-drain-timeout", "1s"}
	cmd, _ := e.start(t, args...)
	waitLong(t, "some rows COMPLETED", func() bool { return e.count(t, "EVENT", "COMPLETED") >= n/10 })
	_ = cmd.Process.Signal(syscall.SIGKILL) // kill -9: rows are left PROCESSING
	_ = cmd.Wait()
	t.Logf("at the kill: %d PROCESSING, %d COMPLETED, %d PENDING", e.count(t, "EVENT", "PROCESSING"), e.count(t, "EVENT", "COMPLETED"), e.count(t, "EVENT", "PENDING"))
	if n := e.count(t, "EVENT", "PROCESSING"); n == 0 {
		t.Log("no row was PROCESSING at the kill; the test proved less than it could")
	}
	cmd, logs := e.start(t, args...)
	waitLong(t, "every row COMPLETED after the restart", func() bool { return e.count(t, "EVENT", "COMPLETED") == n })
	stop(t, cmd, logs)
	// Rows in flight at the kill may be stored twice (at least once); none
	// is lost, none FAILED, FIFO holds for first deliveries.
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.EventsPath), 10, n, false)
	var charged int
	if e.mongo != nil {
		charged = e.countMongo(t, "EVENT", bson.D{{Key: "retryCount", Value: bson.D{{Key: "$gt", Value: 0}}}})
	} else if err := e.db.QueryRow(`SELECT count(*) FROM ` + e.table("EVENT") + ` WHERE retry_count > 0`).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if charged != 0 {
		t.Errorf("%d rows were charged a retry by the recovery", charged)
	}
}
