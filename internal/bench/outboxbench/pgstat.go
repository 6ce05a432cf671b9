package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// tableWork is what PostgreSQL's statistics count for the tables of one
// schema: shared-buffer accesses (hits and reads, heap, indexes and TOAST)
// and row versions written. Unlike wall-clock figures these do not move
// with the machine's load.
type tableWork struct {
	buffers, inserts, updates, hotUpdates, deletes int64
}

// schemaWork reads the cumulative statistics of the tables of schema.
// Backends publish their counts when they go idle (within about a second)
// or exit, so callers wait for that before reading.
func schemaWork(ctx context.Context, pool *pgxpool.Pool, schema string) (tableWork, error) {
	var w tableWork
	err := pool.QueryRow(ctx, `SELECT
	coalesce(sum(coalesce(io.heap_blks_read, 0) + coalesce(io.heap_blks_hit, 0) + coalesce(io.idx_blks_read, 0) + coalesce(io.idx_blks_hit, 0)
		+ coalesce(io.toast_blks_read, 0) + coalesce(io.toast_blks_hit, 0) + coalesce(io.tidx_blks_read, 0) + coalesce(io.tidx_blks_hit, 0)), 0)::bigint,
	coalesce(sum(st.n_tup_ins), 0)::bigint, coalesce(sum(st.n_tup_upd), 0)::bigint,
	coalesce(sum(st.n_tup_hot_upd), 0)::bigint, coalesce(sum(st.n_tup_del), 0)::bigint
FROM pg_statio_user_tables io JOIN pg_stat_user_tables st ON st.relid = io.relid
WHERE io.schemaname = $1`, schema).Scan(&w.buffers, &w.inserts, &w.updates, &w.hotUpdates, &w.deletes)
	return w, err
}

// settledWork waits (at most 30 s) until the tables of schema count at
// least inserts row inserts and two readings a second apart agree, and
// returns the last reading.
func settledWork(ctx context.Context, pool *pgxpool.Pool, schema string, inserts int64) (tableWork, error) {
	settle()
	prev, err := schemaWork(ctx, pool, schema)
	if err != nil {
		return prev, err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		w, err := schemaWork(ctx, pool, schema)
		if err != nil {
			return w, err
		}
		if w == prev && w.inserts >= inserts {
			return w, nil
		}
		prev = w
	}
	return prev, nil
}

// settle waits for idle backends to publish their statistics.
func settle() { time.Sleep(1500 * time.Millisecond) }

// perMessage formats the work between a and b per message.
func (b tableWork) perMessage(a tableWork, n int) string {
	f := func(v int64) float64 { return float64(v) / float64(n) }
	return fmt.Sprintf("%.1f buffer accesses, %.2f row inserts, %.2f updates (%.2f HOT) per msg",
		f(b.buffers-a.buffers), f(b.inserts-a.inserts), f(b.updates-a.updates), f(b.hotUpdates-a.hotUpdates))
}

// relationWork reads the shared-buffer accesses of each table (its heap)
// and each index of schema, and how many of them were reads (a miss of
// shared buffers: the page came from the operating system).
func relationWork(ctx context.Context, pool *pgxpool.Pool, schema string) (map[string][2]int64, error) {
	rows, err := pool.Query(ctx, `SELECT relname || ' (heap)', coalesce(heap_blks_read, 0) + coalesce(heap_blks_hit, 0), coalesce(heap_blks_read, 0)
FROM pg_statio_user_tables WHERE schemaname = $1
UNION ALL
SELECT indexrelname, coalesce(idx_blks_read, 0) + coalesce(idx_blks_hit, 0), coalesce(idx_blks_read, 0)
FROM pg_statio_user_indexes WHERE schemaname = $1`, schema)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	w := map[string][2]int64{}
	for rows.Next() {
		var name string
		var n, read int64
		if err := rows.Scan(&name, &n, &read); err != nil {
			return nil, err
		}
		w[name] = [2]int64{n, read}
	}
	return w, rows.Err()
}

// printRelationWork prints, per message, the buffer accesses of each
// relation of schema since before, and the reads among them.
func printRelationWork(ctx context.Context, pool *pgxpool.Pool, schema string, before map[string][2]int64, n int) error {
	after, err := relationWork(ctx, pool, schema)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(after))
	for k := range after {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if d := after[k][0] - before[k][0]; d > 0 {
			fmt.Printf("    %-40s %6.2f buffer accesses per msg (%.2f read)\n", k, float64(d)/float64(n), float64(after[k][1]-before[k][1])/float64(n))
		}
	}
	return nil
}

// ownCPU returns the CPU time (user + system) so far of the backends whose
// application_name is app, from /proc: load-independent-ish, it does not
// count other clients of the server. False when none is visible.
func ownCPU(ctx context.Context, pool *pgxpool.Pool, app string) (time.Duration, bool) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return 0, false
	}
	defer rows.Close()
	var ticks int64
	found := false
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			return 0, false
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		closing := strings.LastIndexByte(s, ')')
		if closing < 0 {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 13 {
			continue
		}
		for _, v := range f[11:13] { // utime, stime
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		found = true
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ticks) * time.Second / hz, found && rows.Err() == nil
}
