package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.InboxStore[*sql.Tx] = (*Store)(nil)

// InboxClaimTx implements outbox.InboxStore[*sql.Tx]: it records, in the
// caller's transaction tx, that p.Consumer handles (p.Tenant, p.MessageID)
// (INSERT ... ON CONFLICT DO NOTHING) and returns true only when tx
// inserted the record. Invalid params are refused before any statement
// runs, so tx stays usable.
//
// tx should be a write transaction (BEGIN IMMEDIATE, as with Open's
// connections): a second transaction claiming the same message then waits
// for the first to end, and sees its record when it committed.
func (s *Store) InboxClaimTx(ctx context.Context, tx *sql.Tx, p outbox.InboxClaimParams) (bool, error) {
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	if err := outbox.ValidateInboxClaim(p); err != nil {
		return false, err
	}
	r, err := tx.ExecContext(ctx, `INSERT INTO `+s.prefix+`inbox (consumer, tenant, message_id, handled_at)
		VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		p.Consumer, p.Tenant, p.MessageID, s.now(p.Now).UnixMicro())
	if err != nil {
		return false, fmt.Errorf("sqlite: inbox claim: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqlite: inbox claim: %w", err)
	}
	return n == 1, nil
}

// InboxPrune implements outbox.InboxStore: it deletes up to p.Limit
// (default 1000) inbox records handled before p.Before, oldest first, in one
// short write transaction, and returns how many it deleted. Call it in a
// loop until it returns less than the limit.
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
	t := s.prefix + "inbox"
	var n int64
	err := s.writeTx(ctx, func(q querier) error {
		r, err := q.ExecContext(ctx, `DELETE FROM `+t+` WHERE rowid IN (
			SELECT rowid FROM `+t+` WHERE handled_at < ?1 ORDER BY handled_at LIMIT ?2)`,
			s.now(p.Before).UnixMicro(), limit)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sqlite: inbox prune: %w", err)
	}
	return int(n), nil
}
