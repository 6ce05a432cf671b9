package postgres

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// TestWritePathPlans pins the access paths that keep the work per drained
// message low, on a table analysed while nothing was PROCESSING (a fresh or
// just-analysed table) with another processor's leases in it: the claim
// locks and updates its rows by tuple ID, and the outcome statement finds
// its rows by tuple ID, never by scanning the lease index (which the
// planner, trusting those statistics, otherwise chose, checking every
// leased row of every processor), with or without delete on send.
func TestWritePathPlans(t *testing.T) {
	for _, del := range []bool{false, true} {
		t.Run(fmt.Sprintf("delete-sent=%v", del), func(t *testing.T) {
			var opts Options
			if del {
				opts.DeleteSentTopics = []string{"t"}
			}
			s, pg, ctx := planTable(t, opts, "'k' || i")
			// Another processor holds 1,000 leases.
			for range 2 {
				if _, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "other", Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			// The claim's generic plan (claimSettings), which a claim after a
			// small one runs: the same index and tuple-ID lookups.
			claim := explainPrepared(t, ctx, pg.Pool, claimSettings, s.sql.claimAll, time.Now(), "p", 500, 2000, 100, int64(0), "{}")
			if !strings.Contains(claim, "<= $1") {
				t.Errorf("claim: not the generic plan:\n%s", claim)
			}
			if n := strings.Count(claim, "Tid Scan on "+s.prefix+"messages"); n < 2 {
				t.Errorf("claim: %d tuple-ID lookups, want the lock's and the update's:\n%s", n, claim)
			}
			// The lock and the update each read all their rows in one TID
			// scan of an array, not one rescan per row.
			if n := strings.Count(claim, "TID Cond: (ctid = ANY"); n != 2 {
				t.Errorf("claim: %d tuple-ID array lookups, want 2 (the lock's and the update's):\n%s", n, claim)
			}
			ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()})
			if err != nil || len(ms) == 0 {
				t.Fatalf("claim: %d messages, %v", len(ms), err)
			}
			outcomes := make([]outbox.Outcome, len(ms))
			for i, m := range ms {
				outcomes[i] = outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken}
			}
			hinted, tids, byID := s.tids.split("p", outcomes, map[string]struct{}{})
			if len(byID) > 0 {
				t.Fatalf("no tuple ID kept for %d of %d messages", len(byID), len(ms))
			}
			var ids []string
			var att []int32
			var toks []string
			var pm, resp []*string
			var started []*time.Time
			for _, o := range hinted {
				ids, att, toks = append(ids, o.ID), append(att, int32(o.Attempt)), append(toks, o.ClaimToken) //nolint:gosec // small
				pm, resp, started = append(pm, nil), append(resp, nil), append(started, nil)
			}
			args := []any{time.Now(), "p", "", ids, att, toks, pm, resp, started, tids}
			if del {
				args = append(args, s.opts.DeleteSentTopics)
			}
			// The plan the statement runs: the generic one (tidGenericSettings:
			// the tuple IDs are a parameter), but with delete on send, whose
			// deletion of attempt history is planned at every execution.
			settings := tidGenericSettings
			if del {
				settings = tidSettings
			}
			finish := explainPrepared(t, ctx, pg.Pool, settings, s.sql.finishTID[finishSent], args...)
			if generic := strings.Contains(finish, "TID Cond: (ctid = ANY (($"); generic == del {
				t.Errorf("outcome (delete on send %v): generic plan %v:\n%s", del, generic, finish)
			}
			want := 1
			if del {
				want = 2 // the delete and the update of the other topics
			}
			if n := strings.Count(finish, "Tid Scan on "+s.prefix+"messages"); n != want {
				t.Errorf("outcome: %d tuple-ID lookups, want %d:\n%s", n, want, finish)
			}
			// All of them in one TID scan of an array, not one rescan per
			// outcome.
			if n := strings.Count(finish, "TID Cond: (ctid = ANY"); n != want || strings.Contains(finish, "Nested Loop") {
				t.Errorf("outcome: %d tuple-ID array lookups, want %d, and no nested loop:\n%s", n, want, finish)
			}
			if strings.Contains(finish, "messages_leased") {
				t.Errorf("outcome scans the lease index:\n%s", finish)
			}
		})
	}
}

// explainPrepared returns the plan PostgreSQL uses for sql prepared as a
// statement (as pgx prepares it) and executed with args after settings: its
// generic plan when the settings make it one. (EXPLAIN EXECUTE takes no
// parameters, so each argument is spelled as a literal by the server.)
func explainPrepared(t *testing.T, ctx context.Context, pool *pgxpool.Pool, settings, sql string, args ...any) string {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	sd, err := conn.Conn().Prepare(ctx, "explained", sql)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Conn().Deallocate(context.Background(), "explained") }()
	if len(sd.ParamOIDs) != len(args) {
		t.Fatalf("%d arguments for %d parameters", len(args), len(sd.ParamOIDs))
	}
	lits := make([]string, len(args))
	for i, oid := range sd.ParamOIDs {
		var typ string
		if err := conn.QueryRow(ctx, "SELECT format_type($1, NULL)", oid).Scan(&typ); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT coalesce(quote_literal($1::"+typ+"::text), 'NULL') || '::"+typ+"'", args[i]).Scan(&lits[i]); err != nil {
			t.Fatal(err)
		}
	}
	return explainIn(t, ctx, conn.Conn(), settings, "EXECUTE explained("+strings.Join(lits, ", ")+")")
}

// explainIn returns the plan of sql with args, after settings, in a
// transaction rolled back at the end.
func explainIn(t *testing.T, ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, settings, sql string, args ...any) string {
	t.Helper()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if settings != "" {
		if _, err := tx.Exec(ctx, settings); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestEnqueuePlans: the lookup of stored messages probes the primary key
// (keyless messages) and the idempotency index (keyed ones), never scans the
// table, on an analysed table of keyless and keyed messages; and the
// enqueue statements read no table at all, even in the generic plan made
// on an empty table (PostgreSQL caches it per connection, and a scan chosen
// while the table was small would stay as it grew).
func TestEnqueuePlans(t *testing.T) {
	// Every tenth message has a key of its own.
	s, pg, ctx := planTable(t, Options{}, "CASE WHEN i % 10 = 0 THEN 'k' || i ELSE 'm' || i END")
	now := time.Now()
	ids, keys := []string{"n1", "n2"}, []string{"n1", "k-new"} // one keyless, one keyed
	args := []any{ids, []string{"default", "default"}, []string{"t", "t"}, []string{"g1", "g2"}, keys,
		[]*string{nil, nil}, []*string{nil, nil}, []int32{0, 0}, []time.Time{now, now}, []string{"", ""}, [][]byte{nil, nil},
		now, s.groupNS, s.channel, s.notifyKey}
	existing := explainIn(t, ctx, pg.Pool, "", s.sql.existing, []string{"default", "default"}, []string{"m1", "k10"})
	if strings.Contains(existing, "Seq Scan on "+s.prefix+"messages") ||
		!strings.Contains(existing, s.prefix+"messages_idempotency") || !strings.Contains(existing, s.prefix+"messages_pkey") {
		t.Errorf("existing does not probe both unique indexes:\n%s", existing)
	}
	// The generic plans, made on an empty table.
	empty, epg, ectx := planTable(t, Options{}, "'m' || i")
	if _, err := epg.Pool.Exec(ectx, "TRUNCATE "+empty.messages); err != nil {
		t.Fatal(err)
	}
	generic := `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`
	one := []any{"n3", "default", "t", "g3", "n3", nil, nil, int32(0), now, "", []byte(nil), now, empty.groupNS, empty.channel, empty.notifyKey}
	args[12], args[13], args[14] = empty.groupNS, empty.channel, empty.notifyKey
	plans := map[string]string{}
	for v, stmt := range empty.sql.enqueue {
		a := args
		if v&enqueueOne != 0 {
			a = one
		}
		name := fmt.Sprintf("enqueue (one %v, notify %v, unchecked %v)", v&enqueueOne != 0, v&enqueueNotify != 0, v&enqueueUnchecked != 0)
		if v&enqueueNotify == 0 {
			a = a[:13]
		}
		plans[name] = explainPrepared(t, ectx, epg.Pool, generic, stmt, a...)
	}
	for name, plan := range plans {
		for _, l := range strings.Split(plan, "\n") {
			if strings.Contains(l, " on "+empty.prefix+"messages") && !strings.Contains(l, "Insert on ") {
				t.Errorf("%s reads the table (%s):\n%s", name, strings.TrimSpace(l), plan)
			}
		}
	}
}

// planTable returns a migrated store in a fresh schema whose messages table
// holds 5,000 due PENDING messages over 100 groups of topic "t" (IDs 'm' ||
// i, keys keyExpr of i), analysed.
func planTable(t *testing.T, opts Options, keyExpr string) (*Store, testbackend.PostgresSchema, context.Context) {
	t.Helper()
	return planTableAnalysed(t, opts, keyExpr, true)
}

// migratedStore returns a store with opts in a fresh schema, migrated (and
// so analysed empty).
func migratedStore(t *testing.T, opts Options) (*Store, testbackend.PostgresSchema, context.Context) {
	t.Helper()
	pg := testbackend.Postgres(t, 2)
	opts.Schema = pg.Name
	s, err := New(pg.Pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, pg, ctx
}

// planTableAnalysed is planTable, with the table analysed or not.
func planTableAnalysed(t *testing.T, opts Options, keyExpr string, analyse bool) (*Store, testbackend.PostgresSchema, context.Context) {
	t.Helper()
	s, pg, ctx := migratedStore(t, opts)
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.messages+` (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, 'default', 't', 'g' || (i % 100), `+keyExpr+`, 'PENDING', now() - interval '1 second', now(), now(), '{}'::json
FROM generate_series(1, 5000) AS i`); err != nil {
		t.Fatal(err)
	}
	if !analyse {
		return s, pg, ctx
	}
	if _, err := pg.Pool.Exec(ctx, "ANALYZE "+s.messages); err != nil {
		t.Fatal(err)
	}
	return s, pg, ctx
}

// TestEnqueueOneMessageSettlesOnTheGenericPlan: single-message enqueues
// (the common case) reuse PostgreSQL's generic plan of the enqueue
// statement after its first five executions instead of planning it every
// time, which cost more CPU than executing it (the array form was re-planned
// on most connections: its estimates favour a custom plan).
func TestEnqueueOneMessageSettlesOnTheGenericPlan(t *testing.T) {
	s, pg, ctx := planTable(t, Options{}, "'m' || i")
	conn, err := pg.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for i := range 20 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.MessageEnqueueTx(ctx, tx, outbox.MessageEnqueueParams{Messages: []outbox.Message{
			{Topic: "t", Group: fmt.Sprintf("g%d", i%3), Payload: []byte(`{}`)},
		}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		s.sql.enqueueStmt(true, true, true)).Scan(&generic, &custom); err != nil {
		t.Fatalf("the single-message statement is not prepared on the connection: %v", err)
	}
	if generic < 10 || custom > 5 {
		t.Fatalf("20 single-message enqueues: %d generic and %d custom plans, want the generic plan after 5 custom ones", generic, custom)
	}
}

// TestOutcomeStatementPlanMode: the outcome statement by tuple ID runs its
// generic plan (made once per connection), and the delete-on-send one a
// plan made at every execution (see tidGenericSettings).
func TestOutcomeStatementPlanMode(t *testing.T) {
	for _, del := range []bool{false, true} {
		t.Run(fmt.Sprintf("delete-sent=%v", del), func(t *testing.T) {
			var opts Options
			if del {
				opts.DeleteSentTopics = []string{"t"}
			}
			s, pg, ctx := oneConnStore(t, opts)
			for i := range 3 {
				if _, err := s.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{
					{Topic: "t", Group: fmt.Sprintf("g%d", i), Payload: []byte(`{}`)},
				}}); err != nil {
					t.Fatal(err)
				}
				ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
				if err != nil || len(ms) != 1 {
					t.Fatalf("claim: %d messages, %v", len(ms), err)
				}
				res, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(),
					Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: ms[0].ID, Attempt: ms[0].Attempts, ClaimToken: ms[0].ClaimToken}}})
				if err != nil || len(res.LeaseLost) != 0 {
					t.Fatalf("finish: %+v, %v", res, err)
				}
			}
			var generic, custom int64
			if err := pg.Pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
				s.sql.finishTID[finishSent]).Scan(&generic, &custom); err != nil {
				t.Fatalf("the outcome statement by tuple ID is not prepared on the connection: %v", err)
			}
			if del && (generic != 0 || custom != 3) || !del && (generic != 3 || custom != 0) {
				t.Fatalf("3 outcome statements: %d generic and %d custom plans", generic, custom)
			}
		})
	}
}

// TestClaimPlanMode: a claim that follows one of fewer than smallClaim
// messages runs its generic plan; one that follows a larger claim is
// planned at execution (see claimSettings).
func TestClaimPlanMode(t *testing.T) {
	s, pg, ctx := oneConnStore(t, Options{})
	enqueue := func(n int) {
		t.Helper()
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Group: fmt.Sprintf("g%d", i%10), Payload: []byte(`{}`)}
		}
		if _, err := s.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: msgs}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(want int) {
		t.Helper()
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()})
		if err != nil || len(ms) != want {
			t.Fatalf("claimed %d, want %d (%v)", len(ms), want, err)
		}
		p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		if len(ms) > 0 {
			if _, err := s.MessageFinish(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	plans := func() (generic, custom int64) {
		t.Helper()
		if err := pg.Pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
			s.sql.claimAll).Scan(&generic, &custom); err != nil {
			t.Fatal(err)
		}
		return generic, custom
	}
	enqueue(3)
	claim(3) // the first claim: planned at execution
	enqueue(3)
	claim(3) // after a small claim: the generic plan
	if g, c := plans(); g != 1 || c != 1 {
		t.Fatalf("after two small claims: %d generic and %d custom plans, want 1 and 1", g, c)
	}
	enqueue(300)
	claim(300) // after a small claim, a large one: generic
	claim(0)   // after a large claim: planned at execution
	if g, c := plans(); g != 2 || c != 2 {
		t.Fatalf("after a large claim: %d generic and %d custom plans, want 2 and 2", g, c)
	}
}

// oneConnStore returns a migrated store in a fresh schema over a pool of
// one connection, whose prepared statements (pg_prepared_statements) are
// then the store's.
func oneConnStore(t *testing.T, opts Options) (*Store, testbackend.PostgresSchema, context.Context) {
	t.Helper()
	pg := testbackend.Postgres(t, 1)
	opts.Schema = pg.Name
	s, err := New(pg.Pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, pg, ctx
}

// TestListPlans: a tenant's listing and counts read the (tenant, seq) index
// of the rows not leased and the lease index for the leased ones, never the
// whole table, in the generic plan, on an analysed table and on one never
// analysed (as a new table is until autovacuum gets to it).
func TestListPlans(t *testing.T) {
	for _, analysed := range []bool{true, false} {
		t.Run(fmt.Sprintf("analysed=%v", analysed), func(t *testing.T) {
			s, pg, ctx := planTableAnalysed(t, Options{}, "'k' || i", analysed)
			if _, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 100, Owner: "p", Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			generic := `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`
			list := explainPrepared(t, ctx, pg.Pool, generic, s.sql.list, "default", int64(0), "", "", "", 101, false)
			if strings.Contains(list, "Seq Scan on "+s.prefix+"messages") ||
				!strings.Contains(list, s.prefix+"messages_tenant_seq_unleased") || !strings.Contains(list, s.prefix+"messages_leased") {
				t.Errorf("list does not read the two indexes:\n%s", list)
			}
			// Counting every row of the table's one tenant may scan it; the
			// leased rows are still read through the lease index.
			count := explainPrepared(t, ctx, pg.Pool, generic, s.sql.count, "default")
			if !strings.Contains(count, s.prefix+"messages_leased") {
				t.Errorf("count does not read the leased rows through the lease index:\n%s", count)
			}
		})
	}
}

// TestGroupHeadPlans: a claim finds a group's first unfinished message with
// one lookup in the group index (waiting messages) and one in the lease
// index (leased ones), the second only for a window row that is first in
// the group index; the fallback claim does the same; recovery reads the
// lease index, never the table. On an analysed table and on one never
// analysed, in the plans the statements run.
func TestGroupHeadPlans(t *testing.T) {
	maxWaiting := 0 // the most group-index lookups a claim's heads made
	defer func() {
		if maxWaiting <= 100 && !t.Failed() {
			t.Errorf("no claim looked up more window rows (%d) than there are groups: the lease lookups' bound was not put to the test", maxWaiting)
		}
	}()
	for _, analysed := range []bool{true, false} {
		t.Run(fmt.Sprintf("analysed=%v", analysed), func(t *testing.T) {
			// Another processor holds the head of every group (one message
			// per group and claim), so no window row is a head.
			s, pg, ctx := planTableAnalysed(t, Options{ClaimPerGroup: 1}, "'k' || i", analysed)
			for range 2 {
				if _, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "other", Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			waiting := "Index Only Scan using " + s.prefix + "messages_group_waiting"
			leased := "Index Only Scan using " + s.prefix + "messages_leased"
			plans := map[string]string{
				"claim":          explainPrepared(t, ctx, pg.Pool, claimSettings, s.sql.claimAll, time.Now(), "p", 500, 2000, 100, int64(0), "{}"),
				"fallback claim": explainPrepared(t, ctx, pg.Pool, planSettings, s.sql.claimFallbackAll, time.Now(), "p", 500, int64(0), 100),
			}
			for name, plan := range plans {
				if strings.Contains(plan, "Seq Scan on "+s.prefix+"messages") || !strings.Contains(plan, leased) {
					t.Errorf("%s: no lookup of the lease index, or a table scan:\n%s", name, plan)
				}
			}
			// In the heads, a lookup of each index; the lease lookup (run
			// with EXPLAIN ANALYZE, rolled back) only for the window rows that
			// are first in the group index, so at most once per group (100).
			heads := section(plans["claim"], "CTE heads", "CTE runs")
			if !strings.Contains(heads, waiting) || !strings.Contains(heads, leased) {
				t.Errorf("claim: not a lookup of each index in the heads:\n%s", plans["claim"])
			}
			run := section(explainIn(t, ctx, s.db, claimSettings, "(ANALYZE, BUFFERS, COSTS OFF) "+s.sql.claimAll, time.Now(), "p", 500, 2000, 100, int64(0), "{}"), "CTE heads", "CTE runs")
			w, l := loops(t, run, waiting), loops(t, run, leased)
			if l > 100 || l > w {
				t.Errorf("claim: %d group-index and %d lease-index lookups in the heads; want the second at most once per group:\n%s", w, l, run)
			}
			maxWaiting = max(maxWaiting, w)
			recovery := explainPrepared(t, ctx, pg.Pool, planSettings, s.sql.recover, time.Now(), time.Now(), 5, 10000, true, []string{}, []string{})
			if strings.Contains(recovery, "Seq Scan on "+s.prefix+"messages") || !strings.Contains(recovery, s.prefix+"messages_leased") {
				t.Errorf("recovery does not read the lease index:\n%s", recovery)
			}
		})
	}
}

// TestClaimGenericPlanMadeOnEmptyTable: the generic plan of the claim, made
// when the table was empty (a new table whose first claims are small, as a
// processor's are at low rates, and PostgreSQL keeps it per connection),
// locks and updates its rows by tuple ID. An index whose predicate the
// lock's conditions imply, scanned whole because it looked empty, read
// every message of the table in each claim (30,000 rows for 16 claimed,
// 88 ms) once the table had grown.
func TestClaimGenericPlanMadeOnEmptyTable(t *testing.T) {
	s, pg, ctx := migratedStore(t, Options{}) // Migrate analyses the new, empty table
	for _, rows := range []int{0, 20} {
		if rows > 0 {
			if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.messages+` (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
SELECT 'n' || i, 'default', 't', 'g' || (i % 10), 'n' || i, 'PENDING', now(), now(), now(), '{}'::json
FROM generate_series(1, $1::int) AS i`, rows); err != nil {
				t.Fatal(err)
			}
		}
		claimPlansUseTIDs(t, ctx, s, pg)
	}
}

func claimPlansUseTIDs(t *testing.T, ctx context.Context, s *Store, pg testbackend.PostgresSchema) {
	t.Helper()
	for _, stmt := range []string{s.sql.claimAll, s.sql.claimTopics} {
		args := []any{time.Now(), "p", 500, 2000, 100, int64(0), "{}"}
		if stmt == s.sql.claimTopics {
			args = append(args, []string{"t"})
		}
		plan := explainPrepared(t, ctx, pg.Pool, claimSettings, stmt, args...)
		if n := strings.Count(plan, "TID Cond: (ctid = ANY"); n != 2 {
			t.Errorf("claim: %d tuple-ID array lookups, want 2 (the lock's and the update's):\n%s", n, plan)
		}
	}
}

// section returns the part of plan from the first line holding from to
// the next holding to (or the end).
func section(plan, from, to string) string {
	i := strings.Index(plan, from)
	if i < 0 {
		return ""
	}
	rest := plan[i:]
	if j := strings.Index(rest[len(from):], to); j >= 0 {
		return rest[:len(from)+j]
	}
	return rest
}

// loops returns the loops of the plan node whose line holds node (0 when
// none is, or it never ran).
func loops(t *testing.T, plan, node string) int {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(node) + `[^\n]*loops=(\d+)`).FindStringSubmatch(plan)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
