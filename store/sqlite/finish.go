package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageFinish implements outbox.Store: it checks p, then records the
// batch of outcomes with the store's finish, in one transaction. Every
// outcome is fenced by the lease (status PROCESSING, ClaimedBy = p.Owner,
// Attempts = the outcome's Attempt, claim_token = the outcome's ClaimToken,
// NULL for ""); one whose lease was lost changes nothing and its ID is
// returned in LeaseLost. Sent, retry and dead
// outcomes add a row to the attempt history; a release does not (the
// attempt is not counted). A release with NextAttemptAt is a deferral: the
// message is due again at that time, with LastError set from its Error; a
// plain release keeps its due time and LastError.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	return s.core.MessageFinish(ctx, p)
}

// MessageRecover implements outbox.Store: every PROCESSING message claimed
// before p.ClaimedBefore goes back to PENDING (due at once) without its
// lost attempt counted, with one more recovery, or to FAILED when that
// recovery reaches p.MaxRecoveries (outbox.DefaultMaxRecoveries when 0),
// blocking its group when p.DeadLetter says so. Both get LastError code
// "lease_expired" and an attempt row, numbered like the lost claim. It works
// in transactions of 1,000 messages.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	return s.core.MessageRecover(ctx, p)
}

// Finish is the store's batch of outcomes (sqlstore.Dialect): one fenced
// UPDATE ... RETURNING per outcome, in the order given (each statement
// prepared once per call), and one INSERT of the attempt rows.
func (d *dialect) Finish(ctx context.Context, p outbox.MessageFinishParams, now time.Time) (res outbox.FinishResult, applied int, err error) {
	nowUS := now.UnixMicro()
	started := func(t time.Time) time.Time {
		if t.IsZero() {
			return now
		}
		return d.env.Now(t)
	}
	err = d.WriteTx(ctx, func(q sqlstore.Querier) error {
		res.LeaseLost, applied = nil, 0
		att := sqlstore.NewAttemptRows(syntax)
		// Each statement is prepared once per call, when first needed.
		stmts := map[string]*sql.Stmt{}
		defer func() {
			for _, st := range stmts {
				st.Close()
			}
		}()
		// fenced runs one fenced update; ok is false when the lease was lost.
		fenced := func(id, query string, args ...any) (tenant string, ok bool, err error) {
			st, found := stmts[query]
			if !found {
				if st, err = q.PrepareContext(ctx, query); err != nil {
					return "", false, err
				}
				stmts[query] = st
			}
			err = st.QueryRowContext(ctx, args...).Scan(&tenant)
			if sqlstore.IsNoRows(err) {
				res.LeaseLost = append(res.LeaseLost, id)
				return "", false, nil
			}
			if err != nil {
				return "", false, fmt.Errorf("message %s: %w", id, err)
			}
			applied++
			return tenant, true, nil
		}
		for _, o := range p.Outcomes {
			var (
				query string
				args  []any
				next  time.Time
			)
			switch o.Kind {
			case outbox.OutcomeSent:
				query, args = d.q.sent, []any{sqlstore.NullString(o.ProviderMessageID), nowUS, nowUS}
			case outbox.OutcomeRetry:
				next = d.env.Now(o.NextAttemptAt)
				query, args = d.q.retry, []any{next.UnixMicro(), o.Error.Code, o.Error.Message, nowUS}
			case outbox.OutcomeDead:
				query, args = d.q.dead, []any{o.Error.Code, o.Error.Message, nowUS, o.BlockGroup}
			case outbox.OutcomeReleased:
				var nextV, code, msg any
				if !o.NextAttemptAt.IsZero() {
					nextV = d.env.Now(o.NextAttemptAt).UnixMicro()
					if o.Error != nil {
						code, msg = o.Error.Code, o.Error.Message
					}
				}
				query, args = d.q.release, []any{nowUS, nextV, code, msg}
			}
			tenant, ok, err := fenced(o.ID, query, append(args, o.ID, p.Owner, o.Attempt, sqlstore.NullString(o.ClaimToken))...)
			if err != nil {
				return err
			}
			if ok {
				att.AddOutcome(o, tenant, next, started(o.StartedAt), now)
			}
		}
		return att.Exec(ctx, q, d.q.attempts)
	})
	return res, applied, err
}
