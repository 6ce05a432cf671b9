package sqlite

import (
	"database/sql"
)

// inboxInsert records an inbox claim (InboxClaimTx): INSERT ... ON CONFLICT
// DO NOTHING, so a repeated message raises no error and the caller's
// transaction stays usable.
//
// The caller's transaction should be a write transaction (BEGIN IMMEDIATE,
// as with Open's connections): a second transaction claiming the same
// message then waits for the first to end, and sees its record when it
// committed.
func inboxInsert(table string) string {
	return `INSERT INTO ` + table + ` (consumer, tenant, message_id, handled_at)
		VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`
}

// inboxInserted reads inboxInsert's result: inserted when one row was
// affected.
func inboxInserted(r sql.Result) (bool, error) {
	n, err := r.RowsAffected()
	return n == 1, err
}
