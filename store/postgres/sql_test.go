package postgres

import (
	"cmp"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var updateStatements = flag.Bool("update-statements", false, "rewrite testdata/statements.golden from the current statements")

// namedStatement is one statement of a sqlText, named by its field (and
// its index in an array of variants, as in "finish[5]").
type namedStatement struct {
	name, sql string
}

// statementsOf lists every statement of t, in field order: every string
// field and every element of an array of strings, so a statement added to
// sqlText is listed without changing this function.
func statementsOf(t *sqlText) []namedStatement {
	var out []namedStatement
	v := reflect.ValueOf(t).Elem()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.String:
			out = append(out, namedStatement{name, f.String()})
		case reflect.Array:
			for j := range f.Len() {
				out = append(out, namedStatement{fmt.Sprintf("%s[%d]", name, j), f.Index(j).String()})
			}
		default:
			panic("sqlText." + name + ": not a statement nor an array of them")
		}
	}
	return out
}

// nopDB is a DB that New accepts and never uses.
type nopDB struct{ DB }

// viewSQL is the statements of s over the append-only path's state view,
// built as enableLogMode builds them before it replaces some.
func viewSQL(s *Store) sqlText {
	return buildSQL(&Store{opts: s.opts, messages: s.stateView(), attempts: s.attempts, pauses: s.pauses})
}

// statementSets are the option sets whose statements the golden file
// pins: every option that changes the SQL (the table names, AsyncCommit,
// DeleteSentTopics) and the read statements over the append-only path's
// state view (enableLogMode).
func statementSets(t *testing.T) map[string]*sqlText {
	t.Helper()
	sets := map[string]Options{
		"default":    {},
		"prefix":     {Schema: "shop", TablePrefix: "ob_"},
		"async":      {AsyncCommit: true},
		"deletesent": {DeleteSentTopics: []string{"t"}},
		"all":        {Schema: "shop", TablePrefix: "ob_", AsyncCommit: true, DeleteSentTopics: []string{"t", "u"}},
	}
	out := map[string]*sqlText{}
	for name, opts := range sets {
		s, err := New(nopDB{}, opts)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = &s.sql
		view := viewSQL(s)
		out[name+"/stateview"] = &view
	}
	return out
}

// TestStatementsGolden pins every statement, byte for byte, for each option
// set that changes them: a change to how they are built that should not
// change them (a refactoring) must leave this test passing. A deliberate
// change of a statement is recorded with
//
//	go test ./store/postgres -run TestStatementsGolden -update-statements
//
// which rewrites testdata/statements.golden (a SHA-256 per statement).
func TestStatementsGolden(t *testing.T) {
	t.Parallel()
	var lines []string
	texts := map[string]string{}
	for set, st := range statementSets(t) {
		for _, ns := range statementsOf(st) {
			key := set + " " + ns.name
			texts[key] = ns.sql
			lines = append(lines, fmt.Sprintf("%s %x", key, sha256.Sum256([]byte(ns.sql))))
		}
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "statements.golden")
	if *updateStatements {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		i := strings.LastIndexByte(l, ' ')
		want[l[:i]] = l[i+1:]
	}
	for _, l := range lines {
		i := strings.LastIndexByte(l, ' ')
		key, sum := l[:i], l[i+1:]
		if w, ok := want[key]; !ok {
			t.Errorf("%s: a statement the golden file does not know", key)
		} else if w != sum {
			t.Errorf("%s: changed; it is now:\n%s", key, texts[key])
		}
		delete(want, key)
	}
	for key := range want {
		t.Errorf("%s: in the golden file, no longer built", key)
	}
}

// viewReads are the statements the append-only path runs over the state
// view (Store.reads: the others it builds itself, in logmode.go).
var viewReads = []string{"existing", "get", "list", "attempts", "statusOf", "pruneCount"}

// TestStatementsExplain plans every statement, by name, on the real
// PostgreSQL: each is prepared (parsed, its tables and columns resolved,
// its parameters typed) against migrated tables and EXPLAINed in its
// generic plan, for an option set that changes nothing and one that
// changes everything, over the messages table, and the reads over the
// append-only path's state view. The one statement left out is
// abortClash, a DO block, which PostgreSQL neither prepares nor plans
// (its run is tested by the enqueue tests).
func TestStatementsExplain(t *testing.T) {
	t.Parallel()
	for _, opts := range []Options{{}, {TablePrefix: "ob_", AsyncCommit: true, DeleteSentTopics: []string{"t"}}} {
		t.Run("prefix="+cmp.Or(opts.TablePrefix, "default"), func(t *testing.T) {
			t.Parallel()
			s, pg, ctx := migratedStore(t, opts)
			view := viewSQL(s)
			conn, err := pg.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			explain := func(name, sql string) {
				t.Run(name, func(t *testing.T) {
					sd, err := conn.Conn().Prepare(ctx, "", sql)
					if err != nil {
						t.Fatal(err)
					}
					// The generic plan: EXPLAIN EXECUTE with every parameter
					// NULL, planned without their values.
					if _, err := conn.Exec(ctx, "PREPARE explained AS "+sql); err != nil {
						t.Fatal(err)
					}
					defer func() { _, _ = conn.Exec(context.Background(), "DEALLOCATE explained") }()
					exec := "EXECUTE explained"
					if n := len(sd.ParamOIDs); n > 0 {
						exec += "(" + strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") + ")"
					}
					plan := explainIn(t, ctx, conn.Conn(), "SET LOCAL plan_cache_mode = force_generic_plan", exec)
					if !strings.Contains(plan, "cost=") {
						t.Errorf("no plan:\n%s", plan)
					}
				})
			}
			for _, ns := range statementsOf(&s.sql) {
				if ns.name != "abortClash" {
					explain(ns.name, ns.sql)
				}
			}
			for _, ns := range statementsOf(&view) {
				if slices.Contains(viewReads, ns.name) {
					explain("stateview/"+ns.name, ns.sql)
				}
			}
		})
	}
}
