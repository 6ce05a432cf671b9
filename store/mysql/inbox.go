package mysql

import (
	"database/sql"
)

// inboxInsert records an inbox claim (InboxClaimTx). A repeated message
// raises no error (INSERT ... ON DUPLICATE KEY UPDATE, not INSERT IGNORE,
// which would also swallow other errors), so the caller's transaction stays
// usable; a concurrent claim of the same message waits on the primary key.
//
// A duplicate affects 0 rows, or 1 with the DSN's clientFoundRows, the
// same count as an insert; so the duplicate branch also sets the session's
// LAST_INSERT_ID() to 1, which the server reports as the statement's insert
// ID (an insert into the inbox, which has no AUTO_INCREMENT column, reports
// 0). A claim that finds the message already handled therefore leaves
// LAST_INSERT_ID() = 1 in the caller's session.
func inboxInsert(table string) string {
	return `INSERT INTO ` + table + ` (consumer, tenant, message_id, handled_at)
		VALUES (?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE consumer = IF(LAST_INSERT_ID(1) = 1, consumer, consumer)`
}

// inboxInserted reads inboxInsert's result: inserted when one row was
// affected and the insert ID is 0.
func inboxInserted(r sql.Result) (bool, error) {
	n, err := r.RowsAffected()
	if err != nil {
		return false, err
	}
	id, err := r.LastInsertId()
	return n == 1 && id == 0, err
}
