package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// logRecoverMargin is how far before the last recovery's cutoff the next
// one looks for expired leases: a lease mark is written at its writer's
// time, which may commit a little after a recovery passed it.
const logRecoverMargin = time.Minute

// logRecoverAll is how often recovery looks at every lease mark.
const logRecoverAll = 10 * time.Minute

// logExpired locks the groups whose lease marks from $2 to before $1 may
// be expired (blocking, in key order, namespace $3).
const logExpired = `WITH c AS MATERIALIZED (
	SELECT DISTINCT tenant, topic, grp, part FROM {K} WHERE kind = 'lease' AND at < $1 AND at >= $2
), lk AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock($3::int4, h)) AS n FROM (
		SELECT DISTINCT hashtext(tenant || chr(31) || topic || chr(31) || grp || chr(31) || part) AS h FROM c ORDER BY 1) x
)
SELECT c.tenant, c.topic, c.grp, c.part FROM c, lk WHERE lk.n >= 0`

// logRecover recovers the locked groups ($7-$10) whose latest mark is a
// lease taken before $1: the run's waiting messages go back to PENDING
// with one more recovery (a dead letter when it reaches $3, holding its
// group by the rule $4-$6), each lost claim is kept as an attempts row,
// and a done mark at the lease's start frees the group.
const logRecover = `WITH g AS (
	SELECT * FROM unnest($7::text[], $8::text[], $9::text[], $10::int8[]) AS g(tenant, topic, grp, part)
), e AS MATERIALIZED (
	SELECT g.tenant, g.topic, g.grp, g.part, k.done, k.upto, k.at
	FROM g CROSS JOIN LATERAL (` + logLatest + `) k
	WHERE k.kind = 'lease' AND k.at < $1
), r AS MATERIALIZED (
	SELECT b.id, e.at FROM e CROSS JOIN LATERAL (
		SELECT b.id FROM {T} b
		WHERE e.part = 0 AND b.tenant = e.tenant AND b.topic = e.topic AND b.grp = e.grp
			AND b.status = 'PENDING' AND b.grp <> '' AND b.seq > e.done AND b.seq <= e.upto
		UNION ALL
		SELECT b.id FROM {T} b WHERE e.part > 0 AND b.seq = e.part AND b.status = 'PENDING' AND b.claimed_by IS NULL AND b.seq > e.done
	) b
), upd AS (
	UPDATE {T} m SET
		status = CASE WHEN m.recoveries + 1 >= $3 THEN 'FAILED' ELSE 'PENDING' END,
		recoveries = m.recoveries + 1,
		blocks_group = m.recoveries + 1 >= $3 AND m.grp <> ''
			AND (m.topic = ANY($5::text[]) OR ($4::boolean AND NOT m.topic = ANY($6::text[]))),
		last_error_code = 'lease_expired',
		last_error_message = 'the lease expired before the processor recorded an outcome',
		updated_at = $2
	FROM r WHERE m.id = r.id
	RETURNING m.id, m.tenant, m.attempts + 1 AS number, m.status, m.next_attempt_at, r.at
), att AS (
	INSERT INTO {A} (message_id, tenant, number, outcome, error_code, error_message,
		next_attempt_at, started_at, finished_at)
	SELECT id, tenant, number, CASE status WHEN 'FAILED' THEN 'FAILED' ELSE 'RETRY' END,
		'lease_expired', 'the lease expired before the processor recorded an outcome',
		CASE status WHEN 'FAILED' THEN NULL ELSE next_attempt_at END, at, $2
	FROM upd
), mk AS (
	INSERT INTO {K} (tenant, topic, grp, part, kind, done, upto, at)
	SELECT tenant, topic, grp, part, 'done', done, done, $2 FROM e
)
SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'FAILED') FROM upd`

// logRecoverLeases is MessageRecover's part on the append-only path: the
// expired leases are found by their marks' time, from the last cutoff
// (less logRecoverMargin) on.
func (s *Store) logRecoverLeases(ctx context.Context, r recoverArgs) (outbox.RecoverResult, error) {
	s.logc.mu.Lock()
	from := s.logc.recoverFrom
	if time.Since(s.logc.recoverAll) > logRecoverAll {
		// Now and then from the start: a lease written at a time more
		// than logRecoverMargin before the last cutoff (a processor's
		// clock far behind) is recovered all the same.
		from = time.Time{}
		s.logc.recoverAll = time.Now()
	}
	s.logc.mu.Unlock()
	res, err := s.logRecoverRange(ctx, r, from)
	if err != nil {
		return outbox.RecoverResult{}, err
	}
	s.logc.mu.Lock()
	if f := r.before.Add(-logRecoverMargin); f.After(s.logc.recoverFrom) {
		s.logc.recoverFrom = f
	}
	s.logc.mu.Unlock()
	return res, nil
}

// logRecoverRange recovers, in one transaction, the groups whose latest
// mark is a lease written from from to before r.before (logExpired, then
// logRecover).
func (s *Store) logRecoverRange(ctx context.Context, r recoverArgs, from time.Time) (outbox.RecoverResult, error) {
	var res outbox.RecoverResult
	err := s.logTx(ctx, func(tx pgx.Tx) error {
		res = outbox.RecoverResult{}
		ts, ps, gs, parts, err := logGroups(ctx, tx, s.lsql.logExpired, r.before, from, s.groupNS+logClaimLockKey)
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

// logExtend is MessageExtendLease on the append-only path: a group's lease
// is renewed by a new lease mark of the same run, owner and token at the
// call's time, when one of the leases named is in it.
func (s *Store) logExtend(ctx context.Context, p outbox.MessageExtendLeaseParams) (outbox.ExtendLeaseResult, error) {
	now := s.at(p.Now)
	owner := text(p.Owner)
	ids := make([]string, len(p.Leases))
	byID := make(map[string]outbox.Lease, len(p.Leases))
	for i, l := range p.Leases {
		ids[i] = l.ID
		byID[l.ID] = l
	}
	extended := map[string]bool{}
	err := s.logTx(ctx, func(tx pgx.Tx) error {
		clear(extended)
		ts, ps, gs, parts, err := logGroups(ctx, tx, s.lsql.logLockGroups, ids, s.groupNS+logClaimLockKey)
		if err != nil || len(gs) == 0 {
			return err
		}
		runs, order, err := s.logRuns(ctx, tx, ts, ps, gs, parts)
		if err != nil {
			return err
		}
		var w logWrites
		for _, g := range order {
			r := runs[g]
			if r.kind != "lease" || r.owner != owner {
				continue
			}
			renew := false
			for _, row := range r.rows {
				if l, ok := byID[row.id]; ok && l.ClaimToken == r.token && l.Attempt == row.attempts+1 && row.status == "PENDING" {
					extended[row.id], renew = true, true
				}
			}
			if renew {
				w.mark(g, "lease", r.done, r.upto, r.token, r.owner, now)
			}
		}
		if len(w.kTenant) == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, s.lsql.logWrite, w.args(now, "")...)
		return err
	})
	if err != nil {
		return outbox.ExtendLeaseResult{}, wrapErr("extend lease", err)
	}
	return outbox.ExtendLeaseResult{LeaseLost: lost(ids, extended)}, nil
}
