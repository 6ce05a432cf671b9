package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageRecoverOrphans recovers every lease, whenever taken and by whom, as
// MessageRecover recovers the expired ones (outbox.OrphanRecoverer): an
// outbox.Fleet calls it when it took the database from an instance whose
// lease ended, before the database's processor starts, so the messages
// that instance claimed are published again at once rather than after
// ProcessingTimeout. Each goes back to PENDING with its claim token
// cleared, so a late outcome of the previous holder is refused, and on
// the append-only path its group gets a done mark, as after an expired
// lease. It must not run while a processor works the store: it would take
// that processor's leases too.
func (s *Store) MessageRecoverOrphans(ctx context.Context, p outbox.MessageRecoverOrphansParams) (outbox.RecoverResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.RecoverResult{}, err
	}
	r := s.recoverSpec(p.RecoverParams())
	res, err := s.recoverLeases(ctx, r)
	if err != nil || !s.logMode {
		return res, err
	}
	lr, err := s.logRecoverOrphans(ctx, r)
	res.Recovered += lr.Recovered
	res.DeadLettered += lr.DeadLettered
	return res, err
}

// logRecoverOrphans is MessageRecoverOrphans's part on the append-only
// path: every group whose latest mark is a lease, found from the first
// lease mark on. It leaves the expired-lease recovery's cutoff alone:
// logRecoverLeases would move it to the cutoff it was given, here in the
// year 9999, and the expired leases would then wait for its full scan.
func (s *Store) logRecoverOrphans(ctx context.Context, r recoverArgs) (outbox.RecoverResult, error) {
	var res outbox.RecoverResult
	err := s.logTx(ctx, func(tx pgx.Tx) error {
		res = outbox.RecoverResult{}
		ts, ps, gs, parts, err := logGroups(ctx, tx, s.lsql.logExpired, r.before, time.Time{}, s.groupNS+logClaimLockKey)
		if err != nil || len(gs) == 0 {
			return err
		}
		return tx.QueryRow(ctx, s.lsql.logRecover, r.before, r.now, r.maxRecoveries, r.def, r.block, r.cont, ts, ps, gs, parts).
			Scan(&res.Recovered, &res.DeadLettered)
	})
	if err != nil {
		return outbox.RecoverResult{}, wrapErr("recover", err)
	}
	return res, nil
}
