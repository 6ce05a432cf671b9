package sqlite

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
// tx should be a write transaction (BEGIN IMMEDIATE, as InTx begins them
// on Open's database): a second transaction claiming the same message then
// waits for the first to end, and sees its record when it committed.
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
