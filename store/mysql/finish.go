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

// Finish is the store's batch of outcomes (sqlstore.Dialect): one locking
// read of the batch's leases (heldLeases), one UPDATE per kind of outcome
// (per-message values chosen with CASE), and one INSERT of the attempt rows
// (applyOutcomes).
func (d *dialect) Finish(ctx context.Context, p outbox.MessageFinishParams, now time.Time) (outbox.FinishResult, int, error) {
	var res outbox.FinishResult
	applied := 0
	err := d.WriteTx(ctx, func(tx sqlstore.Querier) error {
		held, lost, err := d.heldLeases(ctx, tx, p)
		if err != nil {
			return err
		}
		res.LeaseLost, applied = lost, len(held)
		if applied == 0 {
			return nil
		}
		return d.applyOutcomes(ctx, tx, p.Outcomes, held, now)
	})
	return res, applied, err
}

// heldLease is a message whose lease its outcome holds.
type heldLease struct {
	seq    int64
	tenant string
}

// heldLeases locks the rows of p's outcomes until tx ends and returns
// those whose lease the outcome holds (status PROCESSING, owner p.Owner,
// the outcome's attempt and claim token), by ID, and the IDs of the
// others, in p's order.
func (d *dialect) heldLeases(ctx context.Context, tx sqlstore.Querier, p outbox.MessageFinishParams) (map[string]heldLease, []string, error) {
	type lease struct {
		attempt int
		token   string
	}
	want := make(map[string]lease, len(p.Outcomes)) // id -> the outcome's lease
	ids := make([]any, 0, len(p.Outcomes))
	for _, o := range p.Outcomes {
		want[o.ID] = lease{o.Attempt, o.ClaimToken}
		ids = append(ids, o.ID)
	}
	// Only the batch's rows are locked, through the id index, in id
	// order: concurrent finishers never lock rows they do not name, so
	// they do not deadlock. Status, owner, attempt and claim token are
	// checked here, not in the WHERE clause, which could lead the
	// optimizer to scan (and lock) every PROCESSING row.
	rows, err := tx.QueryContext(ctx, `SELECT seq, id, tenant, attempts, status, claimed_by, claim_token
		FROM `+d.q.messages+` FORCE INDEX (`+d.env.Prefix+`messages_id)
		WHERE id IN (`+sqlstore.Placeholders(len(ids))+`) ORDER BY id FOR UPDATE`, ids...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	held := make(map[string]heldLease, len(ids))
	for rows.Next() {
		var id, tenant, status string
		var owner, token sql.NullString
		var seq int64
		var attempts int
		if err := rows.Scan(&seq, &id, &tenant, &attempts, &status, &owner, &token); err != nil {
			return nil, nil, err
		}
		// A NULL token (a lease taken before tokens) matches an outcome
		// without one.
		if status == string(outbox.StatusProcessing) && owner.String == p.Owner && want[id] == (lease{attempts, token.String}) {
			held[id] = heldLease{seq: seq, tenant: tenant}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var lost []string
	for _, o := range p.Outcomes {
		if _, ok := held[o.ID]; !ok {
			lost = append(lost, o.ID)
		}
	}
	return held, lost, nil
}

// applyOutcomes records the outcomes whose lease is held at now: one UPDATE
// per kind (the per-message values go through CASE) and one INSERT of the
// attempt rows.
func (d *dialect) applyOutcomes(ctx context.Context, tx sqlstore.Querier, outcomes []outbox.Outcome, held map[string]heldLease, now time.Time) error {
	nowS := ts(now)
	att := sqlstore.NewAttemptRows(syntax)
	var sent, retry, dead, rel caseUpdate
	for _, o := range outcomes {
		h, ok := held[o.ID]
		if !ok {
			continue
		}
		var next time.Time
		switch o.Kind {
		case outbox.OutcomeSent:
			sent.add(h.seq, sqlstore.NullString(o.ProviderMessageID))
		case outbox.OutcomeRetry:
			next = d.env.Now(o.NextAttemptAt)
			retry.add(h.seq, ts(next), o.Error.Code, o.Error.Message)
		case outbox.OutcomeDead:
			dead.add(h.seq, o.Error.Code, o.Error.Message, o.BlockGroup)
		case outbox.OutcomeReleased:
			// The attempt is not counted; a deferral sets the due time and
			// the reason.
			var nextV, code, msg any
			if !o.NextAttemptAt.IsZero() {
				nextV = ts(d.env.Now(o.NextAttemptAt))
				if o.Error != nil {
					code, msg = o.Error.Code, o.Error.Message
				}
			}
			rel.add(h.seq, nextV, code, msg)
		}
		started := now
		if !o.StartedAt.IsZero() {
			started = d.env.Now(o.StartedAt)
		}
		att.AddOutcome(o, h.tenant, next, started, now)
	}
	m := d.q.messages
	if err := sent.exec(ctx, tx, m, `status = 'SENT', provider_message_id = {0}, sent_at = ?, updated_at = ?,
		claimed_at = NULL, claimed_by = NULL, claim_token = NULL`, nowS, nowS); err != nil {
		return err
	}
	if err := retry.exec(ctx, tx, m, `status = 'PENDING', next_attempt_at = {0}, last_error_code = {1},
		last_error_message = {2}, updated_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL`, nowS); err != nil {
		return err
	}
	// A dead letter recorded with BlockGroup holds its group (never one of
	// group "": there is no group to hold).
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
	return att.Exec(ctx, tx, d.q.attempts)
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
