package main

import (
	"context"
	"fmt"
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

// settle waits for idle backends to publish their statistics.
func settle() { time.Sleep(1500 * time.Millisecond) }

// perMessage formats the work between a and b per message.
func (b tableWork) perMessage(a tableWork, n int) string {
	f := func(v int64) float64 { return float64(v) / float64(n) }
	return fmt.Sprintf("%.1f buffer accesses, %.2f row inserts, %.2f updates (%.2f HOT) per msg",
		f(b.buffers-a.buffers), f(b.inserts-a.inserts), f(b.updates-a.updates), f(b.hotUpdates-a.hotUpdates))
}
