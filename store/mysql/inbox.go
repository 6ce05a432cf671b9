package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.InboxStore[*sql.Tx] = (*Store)(nil)

// InboxClaimTx implements outbox.InboxStore[*sql.Tx]: it records, in the
// caller's transaction tx, that p.Consumer handles (p.Tenant, p.MessageID)
// and returns true only when tx inserted the record. Invalid params are
// refused before any statement runs, and a repeated message raises no error
// (INSERT ... ON DUPLICATE KEY UPDATE, not INSERT IGNORE, which would also
// swallow other errors): tx stays usable in both cases.
//
// A concurrent transaction claiming the same message waits on the primary
// key until the first ends: it then returns false when the first committed
// and true when it rolled back.
//
// A duplicate affects 0 rows, or 1 with the DSN's clientFoundRows, the
// same count as an insert; so the duplicate branch also sets the session's
// LAST_INSERT_ID() to 1, which the server reports as the statement's insert
// ID (an insert into the inbox, which has no AUTO_INCREMENT column, reports
// 0). A claim that finds the message already handled therefore leaves
// LAST_INSERT_ID() = 1 in tx's session.
func (s *Store) InboxClaimTx(ctx context.Context, tx *sql.Tx, p outbox.InboxClaimParams) (bool, error) {
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	if err := outbox.ValidateInboxClaim(p); err != nil {
		return false, err
	}
	r, err := tx.ExecContext(ctx, `INSERT INTO `+s.prefix+`inbox (consumer, tenant, message_id, handled_at)
		VALUES (?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE consumer = IF(LAST_INSERT_ID(1) = 1, consumer, consumer)`,
		p.Consumer, p.Tenant, p.MessageID, ts(s.now(p.Now)))
	if err != nil {
		return false, fmt.Errorf("mysql: inbox claim: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("mysql: inbox claim: %w", err)
	}
	id, err := r.LastInsertId()
	if err != nil {
		return false, fmt.Errorf("mysql: inbox claim: %w", err)
	}
	return n == 1 && id == 0, nil
}

// InboxPrune implements outbox.InboxStore: it deletes up to p.Limit
// (default 1000) inbox records handled before p.Before, oldest first, in one
// short transaction, and returns how many it deleted. Call it in a loop
// until it returns less than the limit.
func (s *Store) InboxPrune(ctx context.Context, p outbox.InboxPruneParams) (int, error) {
	if p.Before.IsZero() {
		return 0, outbox.InvalidParam("Before", "is required")
	}
	if p.Limit < 0 {
		return 0, outbox.InvalidParam("Limit", "must not be negative")
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	before := ts(s.now(p.Before))
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		r, err := tx.ExecContext(ctx, `DELETE FROM `+s.prefix+`inbox WHERE handled_at < ? ORDER BY handled_at LIMIT ?`, before, limit)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mysql: inbox prune: %w", err)
	}
	return int(n), nil
}
