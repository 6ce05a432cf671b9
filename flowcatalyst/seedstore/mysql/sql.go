package mysql

import (
	"strings"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedsql"
)

// statements are the statements of one table.
type statements struct {
	heads, busy                    string
	cand, candNull                 string
	before, beforeNull             string
	unordered                      string
	finishDefer, finishRelease     string
	recover, recoverDead, recoverN string
	ddl                            string
}

// due is whether a PENDING row may be sent now (processed_at of a PENDING
// row is its retry time).
const due = `(processed_at IS NULL OR processed_at <= NOW())`

// replacer fills in a statement below for table t (already quoted with
// backticks): {T} the table, {COLS} the columns and {DUE} the condition
// due.
func replacer(t string) func(string) string {
	return strings.NewReplacer("{T}", t, "{COLS}", seedcore.Columns, "{DUE}", due).Replace
}

// sharedStatements returns the statements for table t that package
// seedsql runs.
func sharedStatements(t string) seedsql.Statements {
	q := replacer(t)
	return seedsql.Statements{Insert: q(insertSQL), Get: q(getSQL), List: q(listSQL), Count: q(countSQL), Requeue: q(requeueSQL), Prune: q(pruneSQL)}
}

// buildStatements returns this store's own statements for table t.
func buildStatements(t string) statements {
	q := replacer(t)
	return statements{
		heads: q(headsSQL), busy: q(busySQL), cand: q(candSQL), candNull: q(candNullSQL),
		before: q(beforeSQL), beforeNull: q(beforeNullSQL), unordered: q(unorderedSQL),
		finishDefer: q(finishDeferSQL), finishRelease: q(finishReleaseSQL),
		recover: q(recoverSQL), recoverDead: q(recoverDeadSQL), recoverN: q(recoverNSQL), ddl: q(createTableSQL),
	}
}

// insertSQL writes a PENDING row: id, type, message_group, payload,
// created_at, processed_at (the due time, or NULL).
const insertSQL = `INSERT INTO {T} (id, type, message_group, payload, status, retry_count, created_at, processed_at)
VALUES (?, ?, ?, ?, 'PENDING', 0, ?, ?)`

// getSQL reads the row with id ?.
const getSQL = `SELECT {COLS} FROM {T} WHERE id = ?`

// listSQL lists rows by id after ?, with status ? and group ? when set
// (each value given twice), at most ?.
const listSQL = `SELECT {COLS} FROM {T}
WHERE (? = '' OR id > ?) AND (? = '' OR status = ?) AND (? = '' OR message_group = ?)
ORDER BY id
LIMIT ?`

// countSQL counts rows by status.
const countSQL = `SELECT status, count(*) FROM {T} GROUP BY status`

// requeueSQL moves the FAILED row ? back to PENDING, due now.
const requeueSQL = `UPDATE {T} SET status = 'PENDING', retry_count = 0, processed_at = NULL, error_message = NULL, created_at = created_at WHERE id = ? AND status = 'FAILED'`

// pruneSQL deletes up to ? COMPLETED and FAILED rows finished before ?.
const pruneSQL = `DELETE FROM {T}
WHERE status IN ('COMPLETED', 'FAILED') AND processed_at < ?
ORDER BY processed_at
LIMIT ?`

// headsSQL reads only the seed's index (status, message_group,
// created_at): one entry per group with PENDING rows.
const headsSQL = `SELECT message_group, MIN(created_at) FROM {T} WHERE status = 'PENDING' GROUP BY message_group`

// busySQL lists the groups with a row in flight.
const busySQL = `SELECT DISTINCT message_group FROM {T} WHERE status = 'PROCESSING'`

// candSQL locks the first ? PENDING rows of group ?, in order, skipping
// rows another claimer holds; the third column says whether the row is
// due.
const candSQL = `SELECT id, created_at, {DUE} FROM {T}
WHERE status = 'PENDING' AND message_group = ?
ORDER BY created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`

// candNullSQL is candSQL for the NULL group.
const candNullSQL = `SELECT id, created_at, {DUE} FROM {T}
WHERE status = 'PENDING' AND message_group IS NULL
ORDER BY created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`

// beforeSQL counts the group's unfinished rows ordered before the row
// with id ? by (created_at, id): exactly the claim's own rows when the
// claim starts at the group's head. The id breaks ties because TIMESTAMP
// has whole seconds on MySQL, so rows written in the same second are
// common (TSIDs follow creation).
const beforeSQL = `SELECT COUNT(*) FROM {T} b JOIN (SELECT created_at, id FROM {T} WHERE id = ?) l
WHERE b.status IN ('PENDING', 'PROCESSING') AND b.message_group = ?
	AND (b.created_at < l.created_at OR (b.created_at = l.created_at AND b.id < l.id))`

// beforeNullSQL is beforeSQL for the NULL group.
const beforeNullSQL = `SELECT COUNT(*) FROM {T} b JOIN (SELECT created_at, id FROM {T} WHERE id = ?) l
WHERE b.status IN ('PENDING', 'PROCESSING') AND b.message_group IS NULL
	AND (b.created_at < l.created_at OR (b.created_at = l.created_at AND b.id < l.id))`

// unorderedSQL locks up to ? due NULL-group rows without FIFO
// (Options.UnorderedNullGroup).
const unorderedSQL = `SELECT id FROM {T}
WHERE status = 'PENDING' AND message_group IS NULL AND {DUE}
ORDER BY created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`

// recoverSQL puts stuck PROCESSING rows back to PENDING: ? the
// processing timeout in microseconds.
const recoverSQL = `UPDATE {T} SET status = 'PENDING', processed_at = NULL, created_at = created_at
WHERE status = 'PROCESSING' AND (processed_at IS NULL OR processed_at < NOW() - INTERVAL ? MICROSECOND)`

// recoverDeadSQL (Options.RecoveryCountsAttempt) fails the stuck rows
// that used their last attempt: ? the error, the most attempts, the
// timeout.
const recoverDeadSQL = `UPDATE {T} SET status = 'FAILED', processed_at = NOW(), error_message = ?, created_at = created_at
WHERE status = 'PROCESSING' AND retry_count + 1 >= ?
	AND (processed_at IS NULL OR processed_at < NOW() - INTERVAL ? MICROSECOND)`

// recoverNSQL (Options.RecoveryCountsAttempt) puts the other stuck rows
// back to PENDING, counting the lost attempt: ? the timeout.
const recoverNSQL = `UPDATE {T} SET status = 'PENDING', processed_at = NULL, retry_count = retry_count + 1, created_at = created_at
WHERE status = 'PROCESSING'
	AND (processed_at IS NULL OR processed_at < NOW() - INTERVAL ? MICROSECOND)`

// createTableSQL is seed 004's table with what MySQL needs to keep its
// meaning whatever explicit_defaults_for_timestamp says: processed_at
// NULL, created_at not updated automatically. {IDX} is the index.
const createTableSQL = `CREATE TABLE IF NOT EXISTS {T} (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255) NULL,
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    processed_at TIMESTAMP NULL DEFAULT NULL,
    error_message TEXT,
    INDEX {IDX} (status, message_group, created_at)
)`

// claimSetSQL leases the rows IN ({IDS}) a claim locked (so still
// PENDING).
const claimSetSQL = `UPDATE {T} SET status = 'PROCESSING', processed_at = NOW(), created_at = created_at
WHERE id IN ({IDS})`

// claimedSQL reads the rows IN ({IDS}) a claim leased, in order.
const claimedSQL = `SELECT {COLS} FROM {T} WHERE id IN ({IDS}) ORDER BY created_at, id`

// finishLockSQL locks the rows IN ({IDS}) of a finish and reads their
// lease.
const finishLockSQL = `SELECT id, status, processed_at FROM {T} WHERE id IN ({IDS}) FOR UPDATE`

// finishSentSQL marks the rows IN ({IDS}) COMPLETED.
const finishSentSQL = `UPDATE {T} SET status = 'COMPLETED', processed_at = NOW(), error_message = NULL, created_at = created_at
WHERE id IN ({IDS})`

// finishRetrySQL puts the rows IN ({IDS}) back to PENDING for a retry: ?
// the delay in microseconds, the retry_count, the error_message.
const finishRetrySQL = `UPDATE {T} SET status = 'PENDING', processed_at = NOW() + INTERVAL ? MICROSECOND,
	retry_count = ?, error_message = ?, created_at = created_at WHERE id IN ({IDS})`

// finishDeadSQL marks the rows IN ({IDS}) FAILED: ? the error_message.
const finishDeadSQL = `UPDATE {T} SET status = 'FAILED', processed_at = NOW(), error_message = ?, created_at = created_at
WHERE id IN ({IDS})`

// finishDeferSQL puts the row ? back to PENDING, due after ? microseconds
// (a deferral).
const finishDeferSQL = `UPDATE {T} SET status = 'PENDING', processed_at = NOW() + INTERVAL ? MICROSECOND, created_at = created_at WHERE id = ?`

// finishReleaseSQL puts the row ? back to PENDING, due at once.
const finishReleaseSQL = `UPDATE {T} SET status = 'PENDING', processed_at = NULL, created_at = created_at WHERE id = ?`

// inList returns stmt for table t (quoted) with {IDS} n placeholders.
func inList(stmt, t string, n int) string {
	return strings.NewReplacer("{T}", t, "{COLS}", seedcore.Columns,
		"{IDS}", strings.TrimSuffix(strings.Repeat("?, ", n), ", ")).Replace(stmt)
}
