package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageClaim leases up to p.Limit due rows: status PROCESSING,
// processed_at = the database's NOW() (p.Now is not used), one statement
// per table (claimSQL). The tables take turns to go first (so neither
// starves), each taking what the limit leaves, and it returns the rows
// ordered by created_at, then id.
//
// ctx is checked before the claim starts; once started, the claim runs to
// completion (at most 30 s) even if ctx ends, and returns the rows it
// leased.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	return s.core.Claim(ctx, p, func(ctx context.Context, topic string, limit int) ([]outbox.Message, error) {
		return s.claim(ctx, s.tableOf(topic), limit, p.Owner)
	})
}

// claim claims up to limit rows of t: FIFO per group, then, with
// Options.UnorderedNullGroup, NULL-group rows without order.
func (s *Store) claim(ctx context.Context, t *table, limit int, owner string) ([]outbox.Message, error) {
	out, err := s.claimWith(ctx, t, t.sql.claim, owner, limit, min(limit, s.core.Chunk), !s.core.UnorderedNull)
	if err != nil || !s.core.UnorderedNull || len(out) >= limit {
		return out, err
	}
	more, err := s.claimWith(ctx, t, t.sql.claimUnordered, owner, limit-len(out))
	if err != nil {
		if len(out) > 0 {
			s.core.Log.WarnContext(ctx, "seedstore: claim failed", "table", t.Raw, "err", err)
			return out, nil
		}
		return nil, err
	}
	return append(out, more...), nil
}

// claimWith runs the claim statement stmt and remembers the leases of the
// rows it returns.
func (s *Store) claimWith(ctx context.Context, t *table, stmt, owner string, args ...any) ([]outbox.Message, error) {
	rows, err := s.shared.DB.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.Raw, err)
	}
	defer rows.Close()
	var out []outbox.Message
	var claimed []time.Time
	for rows.Next() {
		var r seedcore.Row
		if err := rows.Scan(r.Dest()...); err != nil {
			return nil, fmt.Errorf("seedstore: claim %s: %w", t.Raw, err)
		}
		m := s.core.Message(&r, t.Topic)
		m.ClaimedBy = owner
		out = append(out, m)
		claimed = append(claimed, r.ProcessedAt.Time)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.Raw, err)
	}
	s.core.Remember(t.Topic, out, claimed)
	return out, nil
}
