package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageFinish records outcomes in one transaction, fenced by the claim:
// an outcome applies only while its row is PROCESSING with the processed_at
// this Store set when it claimed it (and the same attempt). Outcomes for
// rows this Store did not claim, or whose lease was lost, are returned in
// LeaseLost. Outcomes are matched to leases by (topic, id): an event and a
// dispatch job may share an id.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	f, err := s.core.BeginFinish(p)
	if err != nil {
		return outbox.FinishResult{}, err
	}
	if len(f.Tables) == 0 {
		return f.Result, nil
	}
	tx, err := s.shared.DB.BeginTx(ctx, nil)
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("seedstore: finish: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var lost []string
	for _, t := range s.tables {
		w := f.Tables[t.Topic]
		if w == nil {
			continue
		}
		if err := finishTable(ctx, tx, t, w, &lost); err != nil {
			return outbox.FinishResult{}, fmt.Errorf("seedstore: finish %s: %w", t.Raw, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return outbox.FinishResult{}, fmt.Errorf("seedstore: finish: %w", err)
	}
	return s.core.End(f, lost), nil
}

// finishTable applies w to t, one statement per kind; the ids whose row no
// longer holds the lease are added to lost.
func finishTable(ctx context.Context, tx *sql.Tx, t *table, w *seedcore.Work, lost *[]string) error {
	for _, step := range []struct {
		stmt string
		b    seedcore.Batch
		args []any
	}{
		{t.sql.finishSent, w.Sent, nil},
		{t.sql.finishRetry, w.Retry, []any{w.Retry.Next, w.Retry.Retry, w.Retry.Msgs}},
		{t.sql.finishDead, w.Dead, []any{w.Dead.Msgs}},
		{t.sql.finishRelease, w.Released, []any{w.Released.DeferTo}},
	} {
		if err := finishBatch(ctx, tx, step.stmt, step.b, step.args, lost); err != nil {
			return err
		}
	}
	return nil
}

// finishBatch runs stmt over b (ids, claim times, then args) and adds the
// ids it did not update to lost.
func finishBatch(ctx context.Context, tx *sql.Tx, stmt string, b seedcore.Batch, args []any, lost *[]string) error {
	if len(b.IDs) == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, stmt, append([]any{b.IDs, b.Claimed}, args...)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	done := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		done[id] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range b.IDs {
		if !done[id] {
			*lost = append(*lost, id)
		}
	}
	return nil
}

// MessageRecover puts back to PENDING every PROCESSING row claimed longer
// than p.Now - p.ClaimedBefore ago by the database's clock (its processor
// died or stalled). As in the seed, a recovered row keeps its retry_count
// ("no lost messages, just delayed"); with Options.RecoveryCountsAttempt the
// lost attempt is counted and a row that used its last attempt
// (p.MaxAttempts, which must be positive) is marked FAILED.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	timeout, before, err := seedcore.BeginRecover(p)
	if err != nil {
		return outbox.RecoverResult{}, err
	}
	var res outbox.RecoverResult
	for _, t := range s.tables {
		if err := s.recover(ctx, t, timeout, p.MaxAttempts, &res); err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.Raw, err)
		}
	}
	s.core.EndRecover(before)
	return res, nil
}

// recover recovers t's stuck rows (recoverSQL) and counts them into res.
func (s *Store) recover(ctx context.Context, t *table, timeout int64, maxAttempts int, res *outbox.RecoverResult) error {
	rows, err := s.shared.DB.QueryContext(ctx, t.sql.recover, timeout, maxAttempts, seedcore.LeaseExpiredText, s.core.RecoveryCounts)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return err
		}
		if status == StatusFailed {
			res.DeadLettered++
		} else {
			res.Recovered++
		}
	}
	return rows.Err()
}
