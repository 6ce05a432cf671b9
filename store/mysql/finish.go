package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// finish is the store's MessageFinish: one locking read of the batch's
// leases, one UPDATE per kind of outcome (per-message values chosen with
// CASE), and one INSERT of the attempt rows.
func (s *Store) finish(ctx context.Context, p outbox.MessageFinishParams, now time.Time) (outbox.FinishResult, int, error) {
	var res outbox.FinishResult
	type lease struct {
		attempt int
		token   string
	}
	want := make(map[string]lease, len(p.Outcomes)) // id -> the outcome's lease
	order := make([]string, 0, len(p.Outcomes))
	for _, o := range p.Outcomes {
		want[o.ID] = lease{o.Attempt, o.ClaimToken}
		order = append(order, o.ID)
	}
	nowS := ts(now)
	started := func(t time.Time) time.Time {
		if t.IsZero() {
			return now
		}
		return s.env.Now(t)
	}
	m := s.q.messages
	applied := 0
	err := s.inTx(ctx, func(tx sqlstore.Querier) error {
		res.LeaseLost, applied = nil, 0
		// The leases that hold, locked until commit.
		args := []any{p.Owner}
		for _, id := range order {
			args = append(args, id)
		}
		// Only the batch's rows are locked, through the id index, in id
		// order: concurrent finishers never lock rows they do not name, so
		// they do not deadlock. Status, owner, attempt and claim token are
		// checked here, not in the WHERE clause, which could lead the
		// optimizer to scan (and lock) every PROCESSING row.
		rows, err := tx.QueryContext(ctx, `SELECT seq, id, tenant, attempts, status, claimed_by, claim_token
			FROM `+m+` FORCE INDEX (`+s.env.Prefix+`messages_id)
			WHERE id IN (`+sqlstore.Placeholders(len(order))+`) ORDER BY id FOR UPDATE`, args[1:]...)
		if err != nil {
			return err
		}
		held := make(map[string]string, len(order)) // id -> tenant
		seqOf := make(map[string]int64, len(order))
		for rows.Next() {
			var id, tenant, status string
			var owner, token sql.NullString
			var seq int64
			var attempts int
			if err := rows.Scan(&seq, &id, &tenant, &attempts, &status, &owner, &token); err != nil {
				rows.Close()
				return err
			}
			// A NULL token (a lease taken before tokens) matches an
			// outcome without one.
			if status == string(outbox.StatusProcessing) && owner.String == p.Owner && want[id] == (lease{attempts, token.String}) {
				held[id] = tenant
				seqOf[id] = seq
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range order {
			if _, ok := held[id]; !ok {
				res.LeaseLost = append(res.LeaseLost, id)
			}
		}
		applied = len(held)
		if applied == 0 {
			return nil
		}
		att := sqlstore.NewAttemptRows(dialect)
		// One UPDATE per kind; the per-message values go through CASE.
		var sent, retry, dead, rel caseUpdate
		for _, o := range p.Outcomes {
			tenant, ok := held[o.ID]
			if !ok {
				continue
			}
			seq := seqOf[o.ID]
			var next time.Time
			switch o.Kind {
			case outbox.OutcomeSent:
				sent.add(seq, sqlstore.NullString(o.ProviderMessageID))
			case outbox.OutcomeRetry:
				next = s.env.Now(o.NextAttemptAt)
				retry.add(seq, ts(next), o.Error.Code, o.Error.Message)
			case outbox.OutcomeDead:
				dead.add(seq, o.Error.Code, o.Error.Message, o.BlockGroup)
			case outbox.OutcomeReleased:
				// The attempt is not counted; a deferral sets the due
				// time and the reason.
				var nextV, code, msg any
				if !o.NextAttemptAt.IsZero() {
					nextV = ts(s.env.Now(o.NextAttemptAt))
					if o.Error != nil {
						code, msg = o.Error.Code, o.Error.Message
					}
				}
				rel.add(seq, nextV, code, msg)
			}
			att.AddOutcome(o, tenant, next, started(o.StartedAt), now)
		}
		if err := sent.exec(ctx, tx, m, `status = 'SENT', provider_message_id = {0}, sent_at = ?, updated_at = ?,
			claimed_at = NULL, claimed_by = NULL, claim_token = NULL`, nowS, nowS); err != nil {
			return err
		}
		if err := retry.exec(ctx, tx, m, `status = 'PENDING', next_attempt_at = {0}, last_error_code = {1},
			last_error_message = {2}, updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL`, nowS); err != nil {
			return err
		}
		// A dead letter recorded with BlockGroup holds its group (never one
		// of group "": there is no group to hold).
		if err := dead.exec(ctx, tx, m, `status = 'FAILED', last_error_code = {0}, last_error_message = {1},
			updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL, blocks_group = ({2} AND grp <> '')`, nowS); err != nil {
			return err
		}
		if err := rel.exec(ctx, tx, m, `status = 'PENDING', attempts = attempts - 1, updated_at = ?,
			next_attempt_at = COALESCE({0}, next_attempt_at),
			last_error_code = CASE WHEN {1} IS NULL THEN last_error_code ELSE {1} END,
			last_error_message = CASE WHEN {1} IS NULL THEN last_error_message ELSE {2} END,
			claimed_at = NULL, claimed_by = NULL, claim_token = NULL`, nowS); err != nil {
			return err
		}
		return att.Exec(ctx, tx, s.q.attempts)
	})
	return res, applied, err
}

// caseUpdate builds one UPDATE of several messages by seq (the primary
// key), each with its own values: {i} in the SET list becomes
// CASE seq WHEN ? THEN ? ... END.
type caseUpdate struct {
	seqs []int64
	vals [][]any
}

func (c *caseUpdate) add(seq int64, vals ...any) {
	c.seqs = append(c.seqs, seq)
	c.vals = append(c.vals, vals)
}

// exec runs UPDATE table SET set WHERE seq IN (...); set's plain ? marks
// take fixed, in order.
func (c *caseUpdate) exec(ctx context.Context, q sqlstore.Querier, table, set string, fixed ...any) error {
	if len(c.seqs) == 0 {
		return nil
	}
	// Placeholders appear in the SET list in text order; collect the
	// arguments in that order.
	var b strings.Builder
	var args []any
	fi := 0
	for i := 0; i < len(set); i++ {
		switch {
		case set[i] == '?':
			b.WriteByte('?')
			args = append(args, fixed[fi])
			fi++
		case set[i] == '{':
			j := strings.IndexByte(set[i:], '}')
			col := 0
			_, _ = fmt.Sscanf(set[i+1:i+j], "%d", &col)
			b.WriteString("CASE seq")
			for k, seq := range c.seqs {
				b.WriteString(" WHEN ? THEN ?")
				args = append(args, seq, c.vals[k][col])
			}
			b.WriteString(" END")
			i += j
		default:
			b.WriteByte(set[i])
		}
	}
	for _, seq := range c.seqs {
		args = append(args, seq)
	}
	_, err := q.ExecContext(ctx, `UPDATE `+table+` SET `+b.String()+` WHERE seq IN (`+sqlstore.Placeholders(len(c.seqs))+`)`, args...)
	return err
}
