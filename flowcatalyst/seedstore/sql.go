package seedstore

import "strings"

type statements struct {
	claim                                              string
	finishSent, finishRetry, finishDead, finishRelease string
	recover, get, list, count, requeue, prune          string
}

// buildStatements returns the statements for table t (already quoted).
func buildStatements(t string) statements {
	q := func(s string) string {
		return strings.NewReplacer("{T}", t, "{COLS}", columns).Replace(s)
	}
	mcols := "m." + strings.ReplaceAll(columns, ", ", ", m.")
	return statements{
		// cand: due PENDING rows, oldest first, whose group has no earlier
		// row in flight or waiting for a retry, row-locked (rows another
		// claimer holds are skipped). valid: a row of a group is kept only
		// if every earlier unfinished row of its group is in cand too, so a
		// row is never claimed while an earlier one is held by a concurrent
		// claim, skipped by SKIP LOCKED, or cut by the limit.
		claim: q(`WITH cand AS MATERIALIZED (
	SELECT t.id, t.message_group, t.created_at FROM {T} t
	WHERE t.status = 'PENDING' AND (t.processed_at IS NULL OR t.processed_at <= $1::timestamp)
		AND (coalesce(t.message_group, '') = '' OR NOT EXISTS (
			SELECT 1 FROM {T} b
			WHERE b.message_group = t.message_group
				AND (b.created_at, b.id) < (t.created_at, t.id)
				AND (b.status = 'PROCESSING' OR (b.status = 'PENDING' AND b.processed_at > $1::timestamp))))
	ORDER BY t.created_at, t.id
	LIMIT $2
	FOR UPDATE OF t SKIP LOCKED
), valid AS (
	SELECT c.id FROM cand c
	WHERE coalesce(c.message_group, '') = '' OR NOT EXISTS (
		SELECT 1 FROM {T} b
		WHERE b.message_group = c.message_group
			AND (b.created_at, b.id) < (c.created_at, c.id)
			AND b.status IN ('PENDING', 'PROCESSING')
			AND NOT EXISTS (SELECT 1 FROM cand c2 WHERE c2.id = b.id))
), upd AS (
	UPDATE {T} m SET status = 'PROCESSING', processed_at = $1::timestamp
	FROM valid v
	WHERE m.id = v.id AND m.status = 'PENDING'
	RETURNING ` + mcols + `
)
SELECT {COLS} FROM upd ORDER BY created_at, id`),

		finishSent: q(`UPDATE {T} m SET status = 'COMPLETED', processed_at = $3::timestamp, error_message = NULL
FROM unnest($1::text[], $2::timestamp[]) AS x(id, claimed)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`),
		finishRetry: q(`UPDATE {T} m SET status = 'PENDING', processed_at = x.next, retry_count = x.rc, error_message = x.msg
FROM unnest($1::text[], $2::timestamp[], $3::timestamp[], $4::int[], $5::text[]) AS x(id, claimed, next, rc, msg)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`),
		finishDead: q(`UPDATE {T} m SET status = 'FAILED', processed_at = $3::timestamp, error_message = x.msg
FROM unnest($1::text[], $2::timestamp[], $4::text[]) AS x(id, claimed, msg)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`),
		finishRelease: q(`UPDATE {T} m SET status = 'PENDING', processed_at = x.next
FROM unnest($1::text[], $2::timestamp[], $3::timestamp[]) AS x(id, claimed, next)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.processed_at = x.claimed
RETURNING m.id`),

		recover: q(`UPDATE {T} SET
	status = CASE WHEN retry_count + 1 >= $2::int THEN 'FAILED' ELSE 'PENDING' END,
	retry_count = CASE WHEN retry_count + 1 >= $2::int THEN retry_count ELSE retry_count + 1 END,
	processed_at = CASE WHEN retry_count + 1 >= $2::int THEN $3::timestamp ELSE NULL END,
	error_message = CASE WHEN retry_count + 1 >= $2::int THEN $4::text ELSE error_message END
WHERE status = 'PROCESSING' AND (processed_at IS NULL OR processed_at < $1::timestamp)
RETURNING id, status`),

		get: q(`SELECT {COLS} FROM {T} WHERE id = $1`),
		list: q(`SELECT {COLS} FROM {T}
WHERE ($1::text = '' OR id > $1::text) AND ($2::text = '' OR status = $2::text)
	AND ($3::text = '' OR message_group = $3::text)
ORDER BY id
LIMIT $4`),
		count:   q(`SELECT status, count(*) FROM {T} GROUP BY status`),
		requeue: q(`UPDATE {T} SET status = 'PENDING', retry_count = 0, processed_at = NULL, error_message = NULL WHERE id = $1 AND status = 'FAILED'`),
		prune: q(`DELETE FROM {T} WHERE id IN (
	SELECT id FROM {T}
	WHERE status IN ('COMPLETED', 'FAILED') AND processed_at < $1::timestamp
	ORDER BY processed_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`),
	}
}
