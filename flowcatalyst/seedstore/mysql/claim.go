package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageClaim leases up to p.Limit due rows: status PROCESSING,
// processed_at = the database's NOW() (p.Now is not used). The tables take
// turns to go first (so neither starves), each taking what the limit
// leaves, and it returns the rows ordered by created_at, then id.
//
// A claim is one READ COMMITTED transaction per table of several
// statements: the groups with PENDING rows (one index-only GROUP BY), then
// per group its first rows by SELECT ... FOR UPDATE SKIP LOCKED, kept only
// when nothing earlier in the group is unfinished, then one UPDATE and one
// SELECT of the claimed rows (MySQL has no UPDATE ... RETURNING). It is
// run again after a deadlock or a lock wait timeout.
//
// ctx is checked before the claim starts; once started, the claim runs to
// completion (at most 30 s) even if ctx ends, and returns the rows it
// leased.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	return s.core.Claim(ctx, p, func(ctx context.Context, topic string, limit int) ([]outbox.Message, error) {
		t := s.tableOf(topic)
		return retry(ctx, s, "claim", func() ([]outbox.Message, error) { return s.claim(ctx, t, limit, p.Owner) })
	})
}

// claim claims up to limit rows of t in one transaction.
func (s *Store) claim(ctx context.Context, t *table, limit int, owner string) ([]outbox.Message, error) {
	fail := func(err error) ([]outbox.Message, error) {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.Raw, err)
	}
	tx, err := s.shared.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fail(err)
	}
	defer func() { _ = tx.Rollback() }()
	heads, err := s.heads(ctx, tx, t)
	if err != nil {
		return fail(err)
	}
	var ids []string
	for _, h := range heads {
		if len(ids) >= limit {
			break
		}
		run, err := s.groupRun(ctx, tx, t, h, min(limit-len(ids), s.core.Chunk))
		if err != nil {
			return fail(err)
		}
		ids = append(ids, run...)
	}
	if s.core.UnorderedNull && len(ids) < limit {
		if err := queryEach(ctx, tx, t.sql.unordered, []any{limit - len(ids)}, func(r *sql.Rows) error {
			var id string
			if err := r.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return nil
		}); err != nil {
			return fail(err)
		}
	}
	if len(ids) == 0 {
		return nil, tx.Commit()
	}
	out, claimed, err := s.lease(ctx, tx, t, ids, owner)
	if err != nil {
		return fail(err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	s.core.Remember(t.Topic, out, claimed)
	return out, nil
}

// head is a group with PENDING rows and the created_at of its first.
type head struct {
	g     sql.NullString
	first time.Time
}

// heads returns the groups of t that may be claimed from, those with the
// oldest heads first: a group with a row in flight waits; NULL rows sent
// unordered are claimed apart.
func (s *Store) heads(ctx context.Context, tx *sql.Tx, t *table) ([]head, error) {
	busy := map[string]bool{}
	nullBusy := false
	if err := queryEach(ctx, tx, t.sql.busy, nil, func(r *sql.Rows) error {
		var g sql.NullString
		if err := r.Scan(&g); err != nil {
			return err
		}
		if g.Valid {
			busy[g.String] = true
		} else {
			nullBusy = true
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var heads []head
	if err := queryEach(ctx, tx, t.sql.heads, nil, func(r *sql.Rows) error {
		var h head
		if err := r.Scan(&h.g, &h.first); err != nil {
			return err
		}
		if (h.g.Valid && !busy[h.g.String]) || (!h.g.Valid && !nullBusy && !s.core.UnorderedNull) {
			heads = append(heads, h)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	sort.Slice(heads, func(i, j int) bool {
		if !heads[i].first.Equal(heads[j].first) {
			return heads[i].first.Before(heads[j].first)
		}
		return heads[i].g.String < heads[j].g.String
	})
	return heads, nil
}

// groupRun locks up to n of h's first PENDING rows and returns the ids of
// the run of due rows from the group's head, or none when something
// earlier in the group is unfinished.
func (s *Store) groupRun(ctx context.Context, tx *sql.Tx, t *table, h head, n int) ([]string, error) {
	stmt, args := t.sql.cand, []any{h.g.String, n}
	if !h.g.Valid {
		stmt, args = t.sql.candNull, []any{n}
	}
	var kept []string
	stop := false
	if err := queryEach(ctx, tx, stmt, args, func(r *sql.Rows) error {
		var id string
		var created time.Time
		var due bool
		if err := r.Scan(&id, &created, &due); err != nil {
			return err
		}
		// A group's rows up to its first row not yet due.
		if stop = stop || !due; !stop {
			kept = append(kept, id)
		}
		return nil
	}); err != nil || len(kept) == 0 {
		return nil, err
	}
	// Keep the group's rows only when those ordered before the last one
	// are exactly its unfinished rows ordered before it: nothing earlier
	// is held by another claimer (skipped), PROCESSING or waiting for a
	// retry.
	last := kept[len(kept)-1]
	stmt, args = t.sql.before, []any{last, h.g.String}
	if !h.g.Valid {
		stmt, args = t.sql.beforeNull, []any{last}
	}
	var got int
	if err := tx.QueryRowContext(ctx, stmt, args...).Scan(&got); err != nil {
		return nil, err
	}
	if got != len(kept)-1 {
		return nil, nil
	}
	return kept, nil
}

// lease marks the rows ids (row-locked by this transaction, so still
// PENDING) PROCESSING and returns them with the claim time of each.
func (s *Store) lease(ctx context.Context, tx *sql.Tx, t *table, ids []string, owner string) ([]outbox.Message, []time.Time, error) {
	if _, err := tx.ExecContext(ctx, inList(claimSetSQL, t.Name, len(ids)), anys(ids)...); err != nil {
		return nil, nil, err
	}
	var out []outbox.Message
	var claimed []time.Time
	if err := queryEach(ctx, tx, inList(claimedSQL, t.Name, len(ids)), anys(ids), func(r *sql.Rows) error {
		var rw seedcore.Row
		if err := r.Scan(rw.Dest()...); err != nil {
			return err
		}
		m := s.core.Message(&rw, t.Topic)
		m.ClaimedBy = owner
		out = append(out, m)
		claimed = append(claimed, rw.ProcessedAt.Time)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return out, claimed, nil
}

// queryEach runs stmt in tx and calls each for every row.
func queryEach(ctx context.Context, tx *sql.Tx, stmt string, args []any, each func(*sql.Rows) error) error {
	rows, err := tx.QueryContext(ctx, stmt, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// anys returns ids as statement arguments.
func anys(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
