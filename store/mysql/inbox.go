package mysql

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/outbox"
)

// InboxClaimTx implements outbox.InboxStore[*sql.Tx]: it records, in the
// caller's transaction tx, that p.Consumer handles (p.Tenant, p.MessageID)
// and returns true only when tx inserted the record. Invalid params are
// refused before any statement runs, and a repeated message raises no
// error: tx stays usable in both cases. A concurrent transaction claiming
// the same message waits until the first ends: it then returns false when
// the first committed and true when it rolled back.
//
// A claim that finds the message already handled leaves LAST_INSERT_ID() =
// 1 in the caller's session (the statement sets it to tell a repeat from
// an insert).
func (s *Store) InboxClaimTx(ctx context.Context, tx *sql.Tx, p outbox.InboxClaimParams) (bool, error) {
	return s.core.InboxClaimTx(ctx, tx, p)
}

// InboxPrune implements outbox.InboxStore: it deletes up to p.Limit
// (default 1000) inbox records handled before p.Before, oldest first, in one
// short transaction, and returns how many it deleted. Call it in a loop
// until it returns less than the limit.
func (s *Store) InboxPrune(ctx context.Context, p outbox.InboxPruneParams) (int, error) {
	return s.core.InboxPrune(ctx, p)
}

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
