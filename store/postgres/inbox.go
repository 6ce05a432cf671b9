package postgres

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

var (
	_ outbox.InboxStore[pgx.Tx]  = (*Store)(nil)
	_ outbox.InboxStore[*sql.Tx] = (*SQLEnqueuer)(nil)
)

func (s *Store) inboxTable() string { return s.schema + "." + s.prefix + "inbox" }

func (s *Store) inboxClaimSQL() string {
	return `INSERT INTO ` + s.inboxTable() + ` (consumer, tenant, message_id, handled_at)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`
}

// InboxClaimTx implements outbox.InboxStore[pgx.Tx]: it records, in the
// caller's transaction tx, that p.Consumer handles (p.Tenant, p.MessageID)
// (INSERT ... ON CONFLICT DO NOTHING) and returns true only when tx
// inserted the record. Invalid params are refused before any statement
// runs, so tx stays usable.
//
// A concurrent transaction claiming the same message waits on the primary
// key until the first ends: it then returns false when the first committed
// and true when it rolled back. (Under REPEATABLE READ or SERIALIZABLE, the
// waiting transaction fails with a serialization error instead of false
// when the first commits.)
func (s *Store) InboxClaimTx(ctx context.Context, tx pgx.Tx, p outbox.InboxClaimParams) (bool, error) {
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	if err := p.Validate(); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, s.inboxClaimSQL(), p.Consumer, p.Tenant, p.MessageID, s.at(p.Now))
	if err != nil {
		return false, wrapErr("inbox claim", err)
	}
	return tag.RowsAffected() == 1, nil
}

// InboxPrune implements outbox.InboxStore: it deletes up to p.Limit
// (default 1,000) inbox records handled before p.Before, oldest first, in
// one short statement that skips rows locked by others, and returns how
// many it deleted. Call it in a loop until it returns less than the limit.
func (s *Store) InboxPrune(ctx context.Context, p outbox.InboxPruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	t := s.inboxTable()
	var n int
	err := s.db.QueryRow(ctx, `WITH victims AS (
	SELECT consumer, tenant, message_id FROM `+t+`
	WHERE handled_at < $1
	ORDER BY handled_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), del AS (
	DELETE FROM `+t+` i USING victims v
	WHERE i.consumer = v.consumer AND i.tenant = v.tenant AND i.message_id = v.message_id
	RETURNING 1
)
SELECT count(*) FROM del`, p.Before.UTC().Truncate(time.Microsecond), limit).Scan(&n)
	if err != nil {
		return 0, wrapErr("inbox prune", err)
	}
	return n, nil
}

// InboxClaimTx implements outbox.InboxStore[*sql.Tx] for database/sql
// transactions (pgx stdlib), with the same guarantees as
// Store.InboxClaimTx.
func (e *SQLEnqueuer) InboxClaimTx(ctx context.Context, tx *sql.Tx, p outbox.InboxClaimParams) (bool, error) {
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	if err := p.Validate(); err != nil {
		return false, err
	}
	r, err := tx.ExecContext(ctx, e.s.inboxClaimSQL(), p.Consumer, p.Tenant, p.MessageID, e.s.at(p.Now))
	if err != nil {
		return false, wrapErr("inbox claim", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, wrapErr("inbox claim", err)
	}
	return n == 1, nil
}

// InboxPrune is Store.InboxPrune.
func (e *SQLEnqueuer) InboxPrune(ctx context.Context, p outbox.InboxPruneParams) (int, error) {
	return e.s.InboxPrune(ctx, p)
}
