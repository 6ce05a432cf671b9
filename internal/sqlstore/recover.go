package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// LeaseExpiredCode is the LastError code of a message whose lease expired.
const LeaseExpiredCode = "lease_expired"

const leaseExpiredMsg = "the lease expired before the outcome was recorded (the processor stopped or stalled)"

// uncharge is the SET clause of a recovered lease: the lost attempt is not
// counted, the recovery is.
const uncharge = "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, recoveries = recoveries + 1"

// recoverChunk is how many expired leases one transaction of
// MessageRecover handles.
const recoverChunk = 1000

// MessageRecoverOrphans is the stores' MessageRecoverOrphans
// (outbox.OrphanRecoverer): MessageRecover for every lease, whenever taken.
func (s *Store) MessageRecoverOrphans(ctx context.Context, p outbox.MessageRecoverOrphansParams) (outbox.RecoverResult, error) {
	return s.MessageRecover(ctx, p.RecoverParams())
}

// MessageRecover is the stores' MessageRecover: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	var res outbox.RecoverResult
	if err := p.Validate(); err != nil {
		return res, err
	}
	maxRecoveries := cmp.Or(p.MaxRecoveries, outbox.DefaultMaxRecoveries)
	now := s.now(p.Now)
	before := s.syntax.Time(s.now(p.ClaimedBefore))
	for {
		var n, nDead, nBack int
		err := s.dialect.WriteTx(ctx, func(q Querier) error {
			var dead, deadBlock, back []any
			att := NewAttemptRows(s.syntax)
			n = 0
			e := &outbox.ErrorInfo{Code: LeaseExpiredCode, Message: leaseExpiredMsg}
			err := scanRows(ctx, q, `SELECT seq, id, tenant, topic, grp, attempts, recoveries, claimed_at FROM `+s.messages+`
				WHERE status = 'PROCESSING' AND claimed_at < ? ORDER BY seq LIMIT ?`+s.syntax.SkipLocked,
				[]any{before, recoverChunk}, func(rows *sql.Rows) error {
					var id, tenant, topic, grp string
					var seq int64
					var attempts, recoveries int
					var claimed Time
					if err := rows.Scan(&seq, &id, &tenant, &topic, &grp, &attempts, &recoveries, &claimed); err != nil {
						return err
					}
					n++
					start := now
					if claimed.Valid {
						start = claimed.T
					}
					if recoveries+1 >= maxRecoveries {
						if p.DeadLetter.Blocks(topic, grp) {
							deadBlock = append(deadBlock, seq)
						} else {
							dead = append(dead, seq)
						}
						att.Add(id, tenant, attempts, outbox.AttemptFailed, e, nil, time.Time{}, start, now)
					} else {
						back = append(back, seq)
						att.Add(id, tenant, attempts, outbox.AttemptRetry, e, nil, now, start, now)
					}
					return nil
				})
			if err != nil || n == 0 {
				return err
			}
			if err := att.Exec(ctx, q, s.attempts); err != nil {
				return err
			}
			nowT := s.syntax.Time(now)
			for i, seqs := range [][]any{dead, deadBlock} {
				if len(seqs) == 0 {
					continue
				}
				if _, err := q.ExecContext(ctx, `UPDATE `+s.messages+` SET status = 'FAILED', `+uncharge+`, last_error_code = ?,
					last_error_message = ?, updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL, blocks_group = ?
					WHERE seq IN (`+Placeholders(len(seqs))+`)`,
					append([]any{LeaseExpiredCode, leaseExpiredMsg, nowT, i == 1}, seqs...)...); err != nil {
					return err
				}
			}
			if len(back) > 0 {
				if _, err := q.ExecContext(ctx, `UPDATE `+s.messages+` SET status = 'PENDING', `+uncharge+`, last_error_code = ?,
					last_error_message = ?, next_attempt_at = `+s.syntax.Earliest("next_attempt_at")+`,
					updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL
					WHERE seq IN (`+Placeholders(len(back))+`)`,
					append([]any{LeaseExpiredCode, leaseExpiredMsg, nowT, nowT}, back...)...); err != nil {
					return err
				}
			}
			nDead, nBack = len(dead)+len(deadBlock), len(back)
			return nil
		})
		if err != nil {
			return res, s.errorf("recover", err)
		}
		res.DeadLettered += nDead
		res.Recovered += nBack
		if n < recoverChunk {
			break
		}
	}
	if res.Recovered+res.DeadLettered > 0 {
		s.Notify()
	}
	return res, nil
}
