package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

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
