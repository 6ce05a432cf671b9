package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// ctl runs outboxctl with args, its stdin empty and not a terminal, and
// returns its exit status and output.
func ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return ctlTerminal(t, "", false, args...)
}

// ctlTerminal runs outboxctl with stdin reading input, a terminal or not.
func ctlTerminal(t *testing.T, input string, terminal bool, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, env{in: strings.NewReader(input), out: &out, err: &errOut, terminal: terminal})
	return code, out.String(), errOut.String()
}

func mustCtl(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, args...)
	if code != 0 {
		t.Fatalf("outboxctl %v: exit %d: %s%s", args, code, out, errOut)
	}
	return out
}

// client runs a database's own command-line client with sql on stdin.
func client(t *testing.T, name string, sqlText string, args ...string) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if testbackend.Required() {
			t.Fatalf("%s is not installed and OUTBOXKIT_REQUIRE_BACKENDS=1", name)
		}
		t.Skipf("%s is not installed", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdin = strings.NewReader(sqlText)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// rows reads a query's rows as lines of tab-separated values.
func rows(t *testing.T, q func(string, ...any) (*sql.Rows, error), query string, args ...any) []string {
	t.Helper()
	r, err := q(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer r.Close()
	cols, _ := r.Columns()
	var out []string
	for r.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := r.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = v.String
		}
		out = append(out, strings.Join(parts, "\t"))
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameLines(t *testing.T, what string, a, b []string) {
	t.Helper()
	if len(a) == 0 {
		t.Fatalf("%s: Migrate created nothing to compare", what)
	}
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Fatalf("%s differ:\nMigrate:\n%s\n\nmigrate sql | client:\n%s", what, strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
}

// TestMigrateSQLPostgres: `migrate sql` applied by psql gives the schema
// Migrate creates (columns, constraints and indexes; the version table
// aside).
func TestMigrateSQLPostgres(t *testing.T) {
	t.Parallel()
	a, b := testbackend.Postgres(t, 2), testbackend.Postgres(t, 2)
	mustCtl(t, "migrate", "up", "--url", a.DSN, "--schema", a.Name)
	script := mustCtl(t, "migrate", "sql", "--url", a.DSN, "--schema", b.Name)
	client(t, "psql", script, "-X", "-q", "-v", "ON_ERROR_STOP=1", a.DSN)

	ctx := context.Background()
	read := func(schema, query string) []string {
		r, err := a.Pool.Query(ctx, query, schema)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		defer r.Close()
		var out []string
		for r.Next() {
			vals, err := r.Values()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, strings.ReplaceAll(fmt.Sprint(vals...), schema+".", "SCHEMA."))
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, c := range []struct{ what, query string }{
		{"columns", `SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''), coalesce(is_identity, '')
			FROM information_schema.columns WHERE table_schema = $1 AND table_name NOT LIKE '%migrations' ORDER BY 1, 2`},
		{"constraints", `SELECT table_name, constraint_name, constraint_type FROM information_schema.table_constraints
			WHERE table_schema = $1 AND table_name NOT LIKE '%migrations' AND constraint_type <> 'CHECK' ORDER BY 1, 2`},
		{"indexes", `SELECT tablename, indexname, indexdef FROM pg_indexes
			WHERE schemaname = $1 AND tablename NOT LIKE '%migrations' ORDER BY 1, 2`},
	} {
		sameLines(t, "PostgreSQL "+c.what, read(a.Name, c.query), read(b.Name, c.query))
	}
}

// TestMigrateSQLMySQL: `migrate sql` applied by the mysql client gives the
// schema Migrate creates.
func TestMigrateSQLMySQL(t *testing.T) {
	t.Parallel()
	a, b := testbackend.MySQL(t, 2), testbackend.MySQL(t, 2)
	cfg, err := gomysql.ParseDSN(a.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mustCtl(t, "migrate", "up", "--url", mysqlURL(cfg, a.Name))
	script := mustCtl(t, "migrate", "sql", "--url", mysqlURL(cfg, b.Name))
	host, port, _ := strings.Cut(cfg.Addr, ":")
	args := []string{"--protocol=TCP", "-h", host, "-P", port, "-u", cfg.User}
	if cfg.Passwd != "" {
		args = append(args, "-p"+cfg.Passwd)
	}
	client(t, "mysql", script, append(args, b.Name)...)

	for _, c := range []struct{ what, query string }{
		{"columns", `SELECT table_name, column_name, column_type, is_nullable, coalesce(column_default, ''), coalesce(character_set_name, ''), extra
			FROM information_schema.columns WHERE table_schema = ? AND table_name NOT LIKE '%schema_version' ORDER BY 1, 2`},
		{"indexes", `SELECT table_name, index_name, seq_in_index, column_name, non_unique FROM information_schema.statistics
			WHERE table_schema = ? AND table_name NOT LIKE '%schema_version' ORDER BY 1, 2, 3`},
		{"tables", `SELECT table_name, engine, table_collation FROM information_schema.tables
			WHERE table_schema = ? AND table_name NOT LIKE '%schema_version' ORDER BY 1`},
	} {
		sameLines(t, "MySQL "+c.what,
			rows(t, func(q string, args ...any) (*sql.Rows, error) { return a.DB.Query(q, args...) }, c.query, a.Name),
			rows(t, func(q string, args ...any) (*sql.Rows, error) { return b.DB.Query(q, args...) }, c.query, b.Name))
	}
}

// TestSQLiteSession drives every command against a SQLite file, as an
// operator would.
func TestSQLiteSession(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	url := "sqlite://" + path
	upOut := mustCtl(t, "migrate", "up", "--url", url)
	st, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	migs := st.Migrations()
	newest := migs[len(migs)-1]
	if !strings.Contains(upOut, fmt.Sprintf("schema version %d (newest known: %d)", newest.Version, newest.Version)) {
		t.Fatalf("migrate up: %s", upOut)
	}
	if out := mustCtl(t, "migrate", "status", "--url", url); !strings.Contains(out, fmt.Sprintf("%03d_%s\tapplied", newest.Version, newest.Name)) ||
		strings.Contains(out, "pending") {
		t.Fatalf("migrate status: %s", out)
	}
	operatorSession(t, url, st, outbox.New[*sql.Tx](st, outbox.Options{}).Enqueue)
	for _, args := range [][]string{
		{"migrate", "sideways", "--url", url},          // unknown action
		{"stats", "--url", "redis://127.0.0.1:6379/0"}, // unsupported store
		{"frobnicate"}, // unknown command
	} {
		if code, _, errOut := ctl(t, args...); code != 2 || errOut == "" {
			t.Errorf("outboxctl %v: exit %d (%q), want 2 with a message", args, code, errOut)
		}
	}
	if out := mustCtl(t, "migrate", "down", "--url", url, "--to", "0", "--yes"); !strings.Contains(out, "schema version 0") {
		t.Fatalf("migrate down: %s", out)
	}
}

// operatorSession drives stats, list, requeue, prune, pause and resume
// against the migrated, empty store at url, as an operator would; st is
// that store opened by the test, enqueue adds messages to it.
func operatorSession(t *testing.T, url string, st outbox.Store, enqueue func(context.Context, ...outbox.Message) ([]outbox.Enqueued, error)) {
	t.Helper()
	// Seed: 3 dead letters of orders (one of tenant B), 1 PENDING sms.
	ctx := context.Background()
	for i, tenant := range []string{"", "", "B"} {
		if _, err := enqueue(ctx, outbox.Message{Tenant: tenant, Topic: "orders", Payload: json.RawMessage(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "o", Now: time.Now()})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	fin := outbox.MessageFinishParams{Owner: "o", Now: time.Now()}
	for _, m := range claimed {
		fin.Outcomes = append(fin.Outcomes, outbox.Outcome{Kind: outbox.OutcomeDead, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, Error: &outbox.ErrorInfo{Code: "http_400", Message: "bad request"}, StartedAt: time.Now()})
	}
	if _, err := st.MessageFinish(ctx, fin); err != nil {
		t.Fatal(err)
	}
	if _, err := enqueue(ctx, outbox.Message{Topic: "sms", Payload: json.RawMessage(`9`)}); err != nil {
		t.Fatal(err)
	}

	out := mustCtl(t, "stats", "--url", url)
	if !regexpLine(out, `orders\s+0\s+0\s+0\s+0\s+3\s+0\s+-`) || !regexpLine(out, `sms\s+1\s+0\s+0\s+0\s+0\s+0\s+\d+s`) {
		t.Fatalf("stats:\n%s", out)
	}
	out = mustCtl(t, "stats", "--url", url, "--watch", "--interval", "10ms", "--times", "2")
	if !strings.Contains(out, "open (PENDING+PROCESSING): 1, draining 0.0 msg/s") {
		t.Fatalf("stats --watch:\n%s", out)
	}
	out = mustCtl(t, "list", "--url", url, "--status", "failed", "--tenant", "B")
	if strings.Count(out, "http_400: bad request") != 1 || !strings.Contains(out, claimed[2].ID) {
		t.Fatalf("list --status failed --tenant B:\n%s", out)
	}

	// Bad usage: exit 2, nothing changed.
	for _, args := range [][]string{
		{"requeue", "--url", url},                      // no filter, no --all
		{"requeue", "--url", url, "--status", "SENT"},  // not dead letters
		{"requeue", "--url", url, "--colour", "red"},   // unknown flag
		{"list", "--url", url, "--status", "LOST"},     // unknown status
		{"list", "--url", url, "--created-after", "x"}, // bad time
		{"prune", "--url", url},                        // no --older-than
	} {
		if code, _, errOut := ctl(t, args...); code != 2 || errOut == "" {
			t.Errorf("outboxctl %v: exit %d (%q), want 2 with a message", args, code, errOut)
		}
	}
	if code, _, _ := ctl(t, "requeue", "--url", url, "--id", "NOPE"); code != 1 {
		t.Errorf("requeue of an unknown ID: exit %d, want 1", code)
	}

	code, out, errOut := ctl(t, "requeue", "--url", url, "--topic", "orders", "--dry-run", "--chunk", "2")
	if code != 0 || !strings.Contains(out, "would requeue 3 dead letters") || strings.Count(errOut, "requeue: ") != 2 {
		t.Fatalf("requeue --dry-run: exit %d\n%s\nstderr (progress, a line per chunk):\n%s", code, out, errOut)
	}
	c, _ := st.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
	if c[outbox.StatusFailed] != 3 {
		t.Fatalf("the dry run changed the store: %v", c)
	}
	out = mustCtl(t, "requeue", "--url", url, "--topic", "orders", "--tenant", ",B", "--chunk", "2")
	if !strings.Contains(out, "requeued 3 dead letters") {
		t.Fatalf("requeue:\n%s", out)
	}
	c, _ = st.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
	if c[outbox.StatusFailed] != 0 || c[outbox.StatusPending] != 4 {
		t.Fatalf("after requeue: %v, want 4 PENDING", c)
	}

	// Prune: finish everything, then prune what is older than 1ms.
	claimed, _ = st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "o2", Now: time.Now()})
	fin = outbox.MessageFinishParams{Owner: "o2", Now: time.Now()}
	for _, m := range claimed {
		fin.Outcomes = append(fin.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, StartedAt: time.Now()})
	}
	if _, err := st.MessageFinish(ctx, fin); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if out := mustCtl(t, "prune", "--url", url, "--older-than", "1ms", "--chunk", "3"); !strings.Contains(out, "pruned 4 ") {
		t.Fatalf("prune: %s", out)
	}

	// Pause and resume: the claim honours them.
	mustCtl(t, "pause", "--url", url, "--topic", "orders", "--tenant", "B")
	if out := mustCtl(t, "pause", "--url", url); !regexpLine(out, `orders\s+\(all\)\s+B\s+\S+`) {
		t.Fatalf("pause (list):\n%s", out)
	}
	if _, err := enqueue(ctx, outbox.Message{Tenant: "B", Topic: "orders", Payload: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "o3", Now: time.Now()}); len(got) != 0 {
		t.Fatalf("claimed %d messages of a paused topic", len(got))
	}
	if code, _, _ := ctl(t, "resume", "--url", url); code != 2 {
		t.Errorf("resume without --topic: exit %d, want 2", code)
	}
	mustCtl(t, "resume", "--url", url, "--topic", "orders", "--tenant", "B")
	if got, _ := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "o3", Now: time.Now()}); len(got) != 1 {
		t.Fatalf("claimed %d messages after resume, want 1", len(got))
	}
	if code, _, _ := ctl(t, "resume", "--url", url, "--topic", "orders", "--tenant", "B"); code != 1 {
		t.Errorf("resume of no pause: exit %d, want 1", code)
	}
}

func regexpLine(out, pattern string) bool {
	return regexp.MustCompile(`(?m)^\s*` + pattern + `\s*$`).MatchString(out)
}

// TestStoragePostgres: `storage` prints each of the store's tables and the
// session whose open transaction holds the cleanup back; on a store that
// does not report its storage it fails, saying so.
func TestStoragePostgres(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 2)
	mustCtl(t, "migrate", "up", "--url", pg.DSN, "--schema", pg.Name)
	pid := pg.HoldHorizon(t, 1)
	out := mustCtl(t, "storage", "--url", pg.DSN, "--schema", pg.Name)
	t.Log("\n" + out)
	for _, want := range []string{"TABLE", pg.Name + ".outbox_messages", pg.Name + ".outbox_attempts", "cleanup horizon:"} {
		if !strings.Contains(out, want) {
			t.Errorf("storage output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nothing holds it back") {
		t.Errorf("storage output with a transaction open (session %d) says nothing holds the horizon back:\n%s", pid, out)
	}

	lite := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	mustCtl(t, "migrate", "up", "--url", lite)
	code, _, errOut := ctl(t, "storage", "--url", lite)
	if code != 1 || !strings.Contains(errOut, "does not report its storage") {
		t.Errorf("storage on SQLite: exit %d, %q; want 1 and the reason", code, errOut)
	}
}
