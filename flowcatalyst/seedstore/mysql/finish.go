package mysql

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
//
// The transaction locks the rows, keeps the outcomes whose row still
// holds the lease, and writes them; it is run again after a deadlock or a
// lock wait timeout.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	f, err := s.core.BeginFinish(p)
	if err != nil {
		return outbox.FinishResult{}, err
	}
	if len(f.Tables) == 0 {
		return f.Result, nil
	}
	lost, err := retry(ctx, s, "finish", func() ([]string, error) { return s.finish(ctx, f.Tables) })
	if err != nil {
		return outbox.FinishResult{}, err
	}
	return s.core.End(f, lost), nil
}

// finish applies work in one transaction and returns the ids of the
// outcomes whose lease was lost.
func (s *Store) finish(ctx context.Context, work map[string]*seedcore.Work) ([]string, error) {
	tx, err := s.shared.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("seedstore: finish: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var lost []string
	for _, t := range s.tables {
		w := work[t.Topic]
		if w == nil {
			continue
		}
		if err := finishTable(ctx, tx, t, w, &lost); err != nil {
			return nil, fmt.Errorf("seedstore: finish %s: %w", t.Raw, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("seedstore: finish: %w", err)
	}
	return lost, nil
}

// finishTable applies w to t: it locks the rows, keeps the outcomes whose
// row is still PROCESSING with the processed_at of this Store's claim (the
// fence), adds the ids of the others to lost, and writes the kept ones.
func finishTable(ctx context.Context, tx *sql.Tx, t *table, w *seedcore.Work, lost *[]string) error {
	held, err := lockLeases(ctx, tx, t, w, lost)
	if err != nil {
		return err
	}
	var sent []string
	for i := range w.Sent.IDs {
		if held(&w.Sent, i) {
			sent = append(sent, w.Sent.IDs[i])
		}
	}
	if len(sent) > 0 {
		if _, err := tx.ExecContext(ctx, inList(finishSentSQL, t.Name, len(sent)), anys(sent)...); err != nil {
			return err
		}
	}
	retries := newChanges()
	for i, id := range w.Retry.IDs {
		if held(&w.Retry, i) {
			retries.add(change{w.Retry.Next[i], w.Retry.Retry[i], w.Retry.Msgs[i]}, id)
		}
	}
	for _, c := range retries.order {
		ids := retries.ids[c]
		if _, err := tx.ExecContext(ctx, inList(finishRetrySQL, t.Name, len(ids)), append([]any{c.next, c.retry, c.msg}, anys(ids)...)...); err != nil {
			return err
		}
	}
	dead := newChanges()
	for i, id := range w.Dead.IDs {
		if held(&w.Dead, i) {
			dead.add(change{msg: w.Dead.Msgs[i]}, id)
		}
	}
	for _, c := range dead.order {
		ids := dead.ids[c]
		if _, err := tx.ExecContext(ctx, inList(finishDeadSQL, t.Name, len(ids)), append([]any{c.msg}, anys(ids)...)...); err != nil {
			return err
		}
	}
	for i, id := range w.Released.IDs {
		if !held(&w.Released, i) {
			continue
		}
		var err error
		if d := w.Released.DeferTo[i]; d != nil {
			_, err = tx.ExecContext(ctx, t.sql.finishDefer, *d, id)
		} else {
			_, err = tx.ExecContext(ctx, t.sql.finishRelease, id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// lockLeases locks the rows of w's outcomes and returns held, which
// reports whether outcome i of b still holds its lease, adding its id to
// lost when not.
func lockLeases(ctx context.Context, tx *sql.Tx, t *table, w *seedcore.Work, lost *[]string) (held func(b *seedcore.Batch, i int) bool, err error) {
	var all []string
	for _, b := range []*seedcore.Batch{&w.Sent, &w.Retry, &w.Dead, &w.Released} {
		all = append(all, b.IDs...)
	}
	type current struct {
		status string
		at     sql.NullTime
	}
	cur := map[string]current{}
	if err := queryEach(ctx, tx, inList(finishLockSQL, t.Name, len(all)), anys(all), func(r *sql.Rows) error {
		var id string
		var c current
		if err := r.Scan(&id, &c.status, &c.at); err != nil {
			return err
		}
		cur[id] = c
		return nil
	}); err != nil {
		return nil, err
	}
	return func(b *seedcore.Batch, i int) bool {
		c, ok := cur[b.IDs[i]]
		if ok && c.status == StatusProcessing && c.at.Valid && c.at.Time.Equal(b.Claimed[i]) {
			return true
		}
		*lost = append(*lost, b.IDs[i])
		return false
	}, nil
}

// change is what an outcome writes: outcomes with the same values
// (typically a failed request's items) are written by one statement.
type change struct {
	next  int64
	retry int
	msg   string
}

// changes are the ids per change, in the order the changes came.
type changes struct {
	order []change
	ids   map[change][]string
}

func newChanges() *changes { return &changes{ids: map[change][]string{}} }

func (c *changes) add(ch change, id string) {
	if c.ids[ch] == nil {
		c.order = append(c.order, ch)
	}
	c.ids[ch] = append(c.ids[ch], id)
}

// MessageRecover puts back to PENDING every PROCESSING row claimed longer
// than p.Now - p.ClaimedBefore ago by the database's clock (its processor
// died or stalled). As in the seed, a recovered row keeps its retry_count
// ("no lost messages, just delayed"); with Options.RecoveryCountsAttempt the
// lost attempt is counted and a row that used its last attempt
// (p.MaxAttempts, which must be positive) is marked FAILED. TIMESTAMP has
// whole seconds on MySQL: a processing timeout must be at least a second.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	timeout, before, err := seedcore.BeginRecover(p)
	if err != nil {
		return outbox.RecoverResult{}, err
	}
	var res outbox.RecoverResult
	for _, t := range s.tables {
		rec, dead, err := s.recover(ctx, t, timeout, p.MaxAttempts)
		res.Recovered += rec
		res.DeadLettered += dead
		if err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.Raw, err)
		}
	}
	s.core.EndRecover(before)
	return res, nil
}

// recover puts t's stuck PROCESSING rows back to PENDING (or, with
// Options.RecoveryCountsAttempt, counts the lost attempt and fails the rows
// that used their last one).
func (s *Store) recover(ctx context.Context, t *table, timeout int64, maxAttempts int) (recovered, dead int, err error) {
	if !s.core.RecoveryCounts {
		res, err := s.shared.DB.ExecContext(ctx, t.sql.recover, timeout)
		if err != nil {
			return 0, 0, err
		}
		n, _ := res.RowsAffected()
		return int(n), 0, nil
	}
	tx, err := s.shared.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, t.sql.recoverDead, seedcore.LeaseExpiredText, maxAttempts, timeout)
	if err != nil {
		return 0, 0, err
	}
	d, _ := res.RowsAffected()
	res, err = tx.ExecContext(ctx, t.sql.recoverN, timeout)
	if err != nil {
		return 0, 0, err
	}
	r, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, 0, err
	}
	return int(r), int(d), nil
}
