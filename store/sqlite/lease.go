package sqlite

import (
	"context"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageExtendLease implements outbox.LeaseExtender: in one write
// transaction it reads which of p.Leases p.Owner still holds (status
// PROCESSING, claimed_by = Owner, attempts = the lease's Attempt,
// claim_token = the lease's ClaimToken, NULL for ""), locking
// them where the database locks rows, and sets their claimed_at to p.Now;
// the IDs of the others are returned in LeaseLost.
func (s *Store) MessageExtendLease(ctx context.Context, p outbox.MessageExtendLeaseParams) (outbox.ExtendLeaseResult, error) {
	return s.core.MessageExtendLease(ctx, p)
}
