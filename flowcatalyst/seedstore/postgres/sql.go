package postgres

import (
	"strings"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedsql"
)

// statements are the statements of one table.
type statements struct {
	claim, claimUnordered                              string
	finishSent, finishRetry, finishDead, finishRelease string
	recover                                            string
}

// dbNow is the database's clock as the seed's TIMESTAMP columns hold it
// (UTC).
const dbNow = `(now() AT TIME ZONE 'UTC')`

// replacer fills in a statement below for table t (already quoted): {T}
// the table, {COLS} the columns, {MCOLS} the columns of the alias m and
// {NOW} the database's clock.
func replacer(t string) func(string) string {
	return strings.NewReplacer("{T}", t, "{COLS}", seedcore.Columns,
		"{MCOLS}", "m."+strings.ReplaceAll(seedcore.Columns, ", ", ", m."), "{NOW}", dbNow).Replace
}

// buildStatements returns this store's own statements for table t.
func buildStatements(t string) statements {
	q := replacer(t)
	return statements{
		claim: q(claimSQL), claimUnordered: q(claimUnorderedSQL),
		finishSent: q(finishSentSQL), finishRetry: q(finishRetrySQL), finishDead: q(finishDeadSQL), finishRelease: q(finishReleaseSQL),
		recover: q(recoverSQL),
	}
}

// sharedStatements returns the statements for table t that package
// seedsql runs.
func sharedStatements(t string) seedsql.Statements {
	q := replacer(t)
	return seedsql.Statements{Insert: q(insertSQL), Get: q(getSQL), List: q(listSQL), Count: q(countSQL), Requeue: q(requeueSQL), Prune: q(pruneSQL)}
}

// claimSQL claims up to $1 rows, at most $2 per group, FIFO per group.
// It reads only through the seed's index (status, message_group,
// created_at), by construction, so its plan does not depend on statistics
// (a fresh table has none until ANALYZE):
//   - grp:   the groups with PENDING rows, one index probe each (a loose
//     index scan);
//   - heads: per group, its first PENDING row, kept when due and no row of
//     the group is PROCESSING; avail counts up to $2 PENDING rows of the
//     group;
//   - pick:  the groups with the oldest heads, until $1 rows;
//   - cand:  up to $2 PENDING rows per picked group, in order, row-locked
//     (rows another claimer holds are skipped);
//   - kept:  a group's rows up to its first row not yet due;
//   - valid: a group's kept rows only when those before the last
//     created_at are exactly its unfinished rows before it (nothing
//     earlier is held by another claimer, skipped or PROCESSING). Rows of
//     a group with equal created_at have no order (as in the seed's ORDER
//     BY message_group, created_at); walking the index by created_at alone
//     keeps every step an index range scan.
//
// $3: whether NULL message_group rows form a group of their own.
const claimSQL = `WITH RECURSIVE grp(g) AS (
	(SELECT message_group FROM {T} WHERE status = 'PENDING' AND message_group IS NOT NULL ORDER BY message_group LIMIT 1)
	UNION ALL
	SELECT (SELECT t.message_group FROM {T} t WHERE t.status = 'PENDING' AND t.message_group > grp.g ORDER BY t.message_group LIMIT 1)
	FROM grp WHERE grp.g IS NOT NULL
), heads AS (
	SELECT grp.g, false AS nullg, h.created_at, h.id,
		(SELECT count(*) FROM (SELECT 1 FROM {T} a WHERE a.status = 'PENDING' AND a.message_group = grp.g LIMIT $2) x) AS avail
	FROM grp CROSS JOIN LATERAL (
		SELECT t.created_at, t.id, t.processed_at FROM {T} t
		WHERE t.status = 'PENDING' AND t.message_group = grp.g
		ORDER BY t.created_at LIMIT 1) h
	WHERE grp.g IS NOT NULL AND (h.processed_at IS NULL OR h.processed_at <= {NOW})
		AND NOT EXISTS (SELECT 1 FROM {T} b WHERE b.status = 'PROCESSING' AND b.message_group = grp.g)
	UNION ALL
	SELECT NULL, true, h.created_at, h.id,
		(SELECT count(*) FROM (SELECT 1 FROM {T} a WHERE a.status = 'PENDING' AND a.message_group IS NULL LIMIT $2) x)
	FROM (SELECT t.created_at, t.id, t.processed_at FROM {T} t
		WHERE $3::boolean AND t.status = 'PENDING' AND t.message_group IS NULL
		ORDER BY t.created_at LIMIT 1) h
	WHERE (h.processed_at IS NULL OR h.processed_at <= {NOW})
		AND NOT EXISTS (SELECT 1 FROM {T} b WHERE b.status = 'PROCESSING' AND b.message_group IS NULL)
), pick AS (
	SELECT g, nullg FROM (
		SELECT g, nullg, coalesce(sum(avail) OVER (ORDER BY created_at, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
		FROM heads) p
	WHERE before < $1
), cand AS MATERIALIZED (
	SELECT r.id, r.message_group, r.created_at, r.processed_at FROM pick CROSS JOIN LATERAL (
		SELECT t.id, t.message_group, t.created_at, t.processed_at FROM {T} t
		WHERE t.status = 'PENDING' AND t.message_group = pick.g
		ORDER BY t.created_at LIMIT $2
		FOR UPDATE SKIP LOCKED) r
	WHERE NOT pick.nullg
	UNION ALL
	SELECT r.id, r.message_group, r.created_at, r.processed_at FROM (
		SELECT t.id, t.message_group, t.created_at, t.processed_at FROM {T} t
		WHERE t.status = 'PENDING' AND t.message_group IS NULL
		ORDER BY t.created_at LIMIT $2
		FOR UPDATE SKIP LOCKED) r
	WHERE EXISTS (SELECT 1 FROM pick WHERE pick.nullg)
), kept AS (
	SELECT id, message_group, created_at FROM (
		SELECT c.*, bool_and(c.processed_at IS NULL OR c.processed_at <= {NOW})
			OVER (PARTITION BY c.message_group ORDER BY c.created_at, c.id) AS ok
		FROM cand c) d
	WHERE ok
), last AS (
	SELECT message_group AS g, max(created_at) AS lc FROM kept GROUP BY message_group
), valid AS (
	SELECT k.id, k.created_at FROM kept k JOIN last l ON l.g IS NOT DISTINCT FROM k.message_group
	WHERE (SELECT count(*) FROM kept k2 WHERE k2.message_group IS NOT DISTINCT FROM l.g AND k2.created_at < l.lc) =
	CASE WHEN l.g IS NULL THEN
		(SELECT count(*) FROM {T} b WHERE b.status IN ('PENDING', 'PROCESSING') AND b.message_group IS NULL AND b.created_at < l.lc)
	ELSE
		(SELECT count(*) FROM {T} b WHERE b.status IN ('PENDING', 'PROCESSING') AND b.message_group = l.g AND b.created_at < l.lc)
	END
	ORDER BY k.created_at, k.id
	LIMIT $1
), upd AS (
	UPDATE {T} m SET status = 'PROCESSING', processed_at = {NOW}
	FROM valid v
	WHERE m.id = v.id -- row-locked by cand, so still PENDING
	RETURNING {MCOLS}
)
SELECT {COLS} FROM upd ORDER BY created_at, id`

// claimUnorderedSQL claims up to $1 NULL-group rows without FIFO (the
// option UnorderedNullGroup).
const claimUnorderedSQL = `WITH cand AS MATERIALIZED (
	SELECT t.id FROM {T} t
	WHERE t.status = 'PENDING' AND t.message_group IS NULL AND (t.processed_at IS NULL OR t.processed_at <= {NOW})
	ORDER BY t.created_at, t.id
	LIMIT $1
	FOR UPDATE SKIP LOCKED
), upd AS (
	UPDATE {T} m SET status = 'PROCESSING', processed_at = {NOW}
	FROM cand c
	WHERE m.id = c.id -- row-locked by cand, so still PENDING
	RETURNING {MCOLS}
)
SELECT {COLS} FROM upd ORDER BY created_at, id`

// finishSentSQL marks rows COMPLETED: $1 ids, $2 the claim time of each
// (the fence). Outcomes and recovery use the database's clock ({NOW}), as
// the seed does, so processors on hosts with skewed clocks agree.
const finishSentSQL = `UPDATE {T} m SET status = 'COMPLETED', processed_at = {NOW}, error_message = NULL
FROM unnest($1::text[], $2::timestamp[]) AS x(id, claimed)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`

// finishRetrySQL puts rows back to PENDING for a retry: $3 the delay in
// microseconds, $4 the retry_count, $5 the error_message.
const finishRetrySQL = `UPDATE {T} m SET status = 'PENDING', processed_at = {NOW} + x.delay * interval '1 microsecond', retry_count = x.rc, error_message = x.msg
FROM unnest($1::text[], $2::timestamp[], $3::bigint[], $4::int[], $5::text[]) AS x(id, claimed, delay, rc, msg)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`

// finishDeadSQL marks rows FAILED: $3 the error_message.
const finishDeadSQL = `UPDATE {T} m SET status = 'FAILED', processed_at = {NOW}, error_message = x.msg
FROM unnest($1::text[], $2::timestamp[], $3::text[]) AS x(id, claimed, msg)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`

// finishReleaseSQL puts rows back to PENDING without counting a retry: $3
// the delay of a deferral in microseconds, NULL for due at once.
const finishReleaseSQL = `UPDATE {T} m SET status = 'PENDING', processed_at = {NOW} + x.delay * interval '1 microsecond'
FROM unnest($1::text[], $2::timestamp[], $3::bigint[]) AS x(id, claimed, delay)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`

// recoverSQL puts back stuck PROCESSING rows: $1 the processing timeout
// in microseconds, $2 the most attempts, $3 the error of a row that used
// its last one, $4 whether a recovered lease counts as an attempt.
const recoverSQL = `UPDATE {T} SET
	status = CASE WHEN $4::boolean AND retry_count + 1 >= $2::int THEN 'FAILED' ELSE 'PENDING' END,
	retry_count = CASE WHEN $4::boolean AND retry_count + 1 < $2::int THEN retry_count + 1 ELSE retry_count END,
	processed_at = CASE WHEN $4::boolean AND retry_count + 1 >= $2::int THEN {NOW} ELSE NULL END,
	error_message = CASE WHEN $4::boolean AND retry_count + 1 >= $2::int THEN $3::text ELSE error_message END
WHERE status = 'PROCESSING' AND (processed_at IS NULL OR processed_at < {NOW} - $1::bigint * interval '1 microsecond')
RETURNING id, status`

// insertSQL writes a PENDING row: $1 id, $2 type, $3 message_group, $4
// payload, $5 created_at, $6 processed_at (the due time, or NULL).
const insertSQL = `INSERT INTO {T} (id, type, message_group, payload, status, retry_count, created_at, processed_at)
VALUES ($1, $2, $3, $4, 'PENDING', 0, $5::timestamp, $6::timestamp)`

// getSQL reads the row with id $1.
const getSQL = `SELECT {COLS} FROM {T} WHERE id = $1`

// listSQL lists rows by id after $1, with status $2 and group $3 when
// set, at most $4.
const listSQL = `SELECT {COLS} FROM {T}
WHERE ($1::text = '' OR id > $1::text) AND ($2::text = '' OR status = $2::text)
	AND ($3::text = '' OR message_group = $3::text)
ORDER BY id
LIMIT $4`

// countSQL counts rows by status.
const countSQL = `SELECT status, count(*) FROM {T} GROUP BY status`

// requeueSQL moves the FAILED row $1 back to PENDING, due now.
const requeueSQL = `UPDATE {T} SET status = 'PENDING', retry_count = 0, processed_at = NULL, error_message = NULL WHERE id = $1 AND status = 'FAILED'`

// pruneSQL deletes up to $2 COMPLETED and FAILED rows finished before
// $1.
const pruneSQL = `DELETE FROM {T} WHERE id IN (
	SELECT id FROM {T}
	WHERE status IN ('COMPLETED', 'FAILED') AND processed_at < $1::timestamp
	ORDER BY processed_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`
