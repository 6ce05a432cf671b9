package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// planSettings pins how PostgreSQL plans the hot-path statements (the
// claim's fallback, outcomes by message ID, recovery; the claim and the
// outcomes by tuple ID take the same settings with a generic plan, see
// claimSettings and tidGenericSettings), for their own transaction only:
//
//   - plan_cache_mode = force_custom_plan: every execution is planned for
//     the table as it is now. A generic plan, which PostgreSQL otherwise
//     caches after five executions of a prepared statement, keeps the
//     row estimates of the moment it was made: a plan made while a new
//     table held a few hundred rows (no statistics yet, or autovacuum off)
//     and reused once a burst or an outage left 100,000 behind turned each
//     claim into a scan of the backlog per candidate (seconds per claim).
//     Planning costs about a millisecond here.
//   - enable_seqscan and enable_bitmapscan off: every table access of these
//     statements is an index lookup by construction (group heads, runs,
//     leases by id); a whole-table scan is never the right plan for them,
//     whatever the statistics say, including none.
//   - jit off: a disabled access path the planner must still use (a scan
//     of a tiny table) is costed at 10^10, far above jit_above_cost, and
//     compiling the statement then took 0.7 s for a millisecond's work.
//
// The settings are local to the statement's transaction (set_config with
// is_local): the caller's connection keeps its own.
const planSettings = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
	set_config('enable_seqscan', 'off', true),
	set_config('enable_bitmapscan', 'off', true),
	set_config('jit', 'off', true)`

// tidSettings are planSettings for a statement that finds its rows by
// tuple ID (the outcome statement, see MessageFinish): with index scans off
// too, the lookup by tuple ID is the only access path left. Otherwise the
// planner, trusting statistics gathered when no message was PROCESSING (a
// fresh or just-analysed table), scans the whole lease index and checks
// every leased row of every processor on the heap. Nested loops are off as
// well: the rows are read in one TID scan of an array and hash-joined to
// the outcomes; inside a loop over the outcomes that scan would run once
// per outcome, reading every row each time.
const tidSettings = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
	set_config('enable_seqscan', 'off', true),
	set_config('enable_bitmapscan', 'off', true),
	set_config('jit', 'off', true),
	set_config('enable_indexscan', 'off', true),
	set_config('enable_indexonlyscan', 'off', true),
	set_config('enable_nestloop', 'off', true)`

// tidGenericSettings are tidSettings with the prepared statement's generic
// plan, made once per connection, instead of a plan made at every
// execution (planning the outcome statement cost 0.3-0.6 ms against 1.9-3.2
// ms to run it for 150 outcomes). With one access path and no nested loop
// left, the statement's plan does not depend on the table's size or
// statistics, so its generic plan is that plan. Not for the delete-on-send
// statement: its deletion of attempt history has every access path
// disabled, and a generic plan made while the attempts table was empty
// would keep scanning it whole once it has grown, where a plan made per
// execution takes the index. TestWritePathPlans and
// TestOutcomeStatementPlanMode check both.
var tidGenericSettings = strings.Replace(tidSettings, "force_custom_plan", "force_generic_plan", 1)

// claimSettings are planSettings with the claim statement's generic plan,
// made once per connection instead of at every execution, for a claim that
// follows one of fewer than smallClaim messages (a processor keeping up
// with a steady flow). Planning the claim costs about 1 ms, as much as
// running a claim of 30. Every part of the claim's plan is an index
// descent, a lateral index scan, a TID scan or a hash or merge join by
// construction (see the claim's pairs and NotPausedRowByRow) but the
// window's scan: a generic plan made while the table held a few messages
// may read the window from the group index, filtered and sorted, instead
// of the claim index in sequence order, which reads every unfinished
// message once a backlog has built up. So a claim that follows a large one
// is planned per execution.
var claimSettings = strings.Replace(planSettings, "force_custom_plan", "force_generic_plan", 1)

// smallClaim is the claim size below which the next claim runs its generic
// plan (see claimSettings). When a burst makes that claim large, it alone
// may read the whole window's worth of unfinished messages, and the claims
// after it are planned per execution.
const smallClaim = 100

// batcher is the optional capability of a DB that pipelines statements
// (*pgxpool.Pool, *pgx.Conn, pgx.Tx).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// planned runs sql with planSettings in one implicit transaction and one
// round trip (a pipelined batch) when the DB can, else in a short explicit
// transaction, and calls each for every result row.
func (s *Store) planned(ctx context.Context, sql string, args []any, each func(pgx.Rows) error) error {
	return s.plannedWith(ctx, planSettings, sql, args, each)
}

// plannedWith is planned with other settings.
func (s *Store) plannedWith(ctx context.Context, settings, sql string, args []any, each func(pgx.Rows) error) error {
	if b, ok := s.db.(batcher); ok {
		batch := &pgx.Batch{}
		batch.Queue(settings)
		batch.Queue(sql, args...)
		br := b.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return err
		}
		if err := eachRow(rows, each); err != nil {
			_ = br.Close()
			return err
		}
		return br.Close()
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, settings); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	if err := eachRow(rows, each); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func eachRow(rows pgx.Rows, each func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	rows.Close()
	return rows.Err()
}
