package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// finish is the store's MessageFinish: one fenced UPDATE ... RETURNING per
// outcome (each statement prepared once per call) and one INSERT of the
// attempt rows.
func (s *Store) finish(ctx context.Context, p outbox.MessageFinishParams, now time.Time) (res outbox.FinishResult, applied int, err error) {
	nowUS := now.UnixMicro()
	started := func(t time.Time) time.Time {
		if t.IsZero() {
			return now
		}
		return s.env.Now(t)
	}
	err = s.writeTx(ctx, func(q sqlstore.Querier) error {
		res.LeaseLost, applied = nil, 0
		att := sqlstore.NewAttemptRows(dialect)
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
		for _, o := range p.Sent {
			tenant, ok, err := fenced(o.ID, s.q.sent, sqlstore.NullString(o.ProviderMessageID), nowUS, nowUS, o.ID, p.Owner, o.Attempt)
			if err != nil {
				return err
			}
			if ok {
				att.Add(o.ID, tenant, o.Attempt, outbox.AttemptSucceeded, nil, o.ProviderResponse, time.Time{}, started(o.StartedAt), now)
			}
		}
		for _, o := range p.Retry {
			next := s.env.Now(o.NextAttemptAt)
			tenant, ok, err := fenced(o.ID, s.q.retry, next.UnixMicro(), o.Error.Code, o.Error.Message, nowUS, o.ID, p.Owner, o.Attempt)
			if err != nil {
				return err
			}
			if ok {
				e := o.Error
				att.Add(o.ID, tenant, o.Attempt, outbox.AttemptRetry, &e, o.ProviderResponse, next, started(o.StartedAt), now)
			}
		}
		for _, o := range p.Dead {
			tenant, ok, err := fenced(o.ID, s.q.dead, o.Error.Code, o.Error.Message, nowUS, o.ID, p.Owner, o.Attempt)
			if err != nil {
				return err
			}
			if ok {
				e := o.Error
				att.Add(o.ID, tenant, o.Attempt, outbox.AttemptFailed, &e, o.ProviderResponse, time.Time{}, started(o.StartedAt), now)
			}
		}
		for _, o := range p.Released {
			var next, code, msg any
			if !o.NextAttemptAt.IsZero() {
				next = s.env.Now(o.NextAttemptAt).UnixMicro()
				if o.Error != nil {
					code, msg = o.Error.Code, o.Error.Message
				}
			}
			if _, _, err := fenced(o.ID, s.q.release, nowUS, next, code, msg, o.ID, p.Owner, o.Attempt); err != nil {
				return err
			}
		}
		return att.Exec(ctx, q, s.q.attempts)
	})
	return res, applied, err
}
