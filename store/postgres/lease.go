package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.LeaseExtender = (*Store)(nil)

// extendSQL renews leases still held by their owner ($2), fenced like an
// outcome (the claim token NULL in x.tok for a lease without one). Only claimed_at changes. It commits durably even with
// Options.AsyncCommit: a renewal forgotten by a server crash could let
// recovery take a message that is being published. It returns the new row
// version's tuple ID for the outcome statement (tidCache).
const extendSQL = `UPDATE {T} m SET claimed_at = $1
FROM unnest($3::text[], $4::int4[], $5::text[]) AS x(id, attempt, tok)
WHERE m.id = x.id AND m.status = 'PROCESSING' AND m.claimed_by = $2 AND m.attempts = x.attempt
	AND m.claim_token::text IS NOT DISTINCT FROM x.tok
RETURNING m.id, m.ctid::text`

// MessageExtendLease implements outbox.LeaseExtender: one UPDATE sets
// claimed_at to p.Now for every lease p.Owner still holds (status
// PROCESSING, claimed_by = Owner, attempts = the lease's Attempt,
// claim_token = the lease's ClaimToken); the IDs of the others are returned
// in LeaseLost.
func (s *Store) MessageExtendLease(ctx context.Context, p outbox.MessageExtendLeaseParams) (outbox.ExtendLeaseResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.ExtendLeaseResult{}, err
	}
	if len(p.Leases) == 0 {
		return outbox.ExtendLeaseResult{}, nil
	}
	if s.logMode {
		return s.logExtend(ctx, p)
	}
	ids := make([]string, len(p.Leases))
	att := make([]int32, len(p.Leases))
	toks := make([]*string, len(p.Leases))
	for i, l := range p.Leases {
		ids[i], att[i], toks[i] = l.ID, int32(l.Attempt), nullText(l.ClaimToken) //nolint:gosec // attempts are small
	}
	extended := make(map[string]bool, len(ids))
	err := s.planned(ctx, s.sql.extend, []any{s.at(p.Now), text(p.Owner), ids, att, toks}, func(r pgx.Rows) error {
		var id, tid string
		if err := r.Scan(&id, &tid); err != nil {
			return err
		}
		extended[id] = true
		s.tids.put(id, tid)
		return nil
	})
	if err != nil {
		return outbox.ExtendLeaseResult{}, wrapErr("extend lease", err)
	}
	var res outbox.ExtendLeaseResult
	for _, id := range ids {
		if !extended[id] {
			res.LeaseLost = append(res.LeaseLost, id)
		}
	}
	return res, nil
}
