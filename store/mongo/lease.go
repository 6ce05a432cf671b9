package mongo

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.LeaseExtender = (*Store)(nil)

// MessageExtendLease implements outbox.LeaseExtender: one unordered bulk
// write (see updateFenced) sets claimed_at to p.Now on every message p.Owner still holds
// (status PROCESSING, claimed_by = Owner, attempts = the lease's Attempt,
// op = the lease's ClaimToken),
// each update fenced like an outcome, and marks it with a token of this
// call; when some did not match, the marked ones are read back. The IDs of
// the others are returned in LeaseLost. It waits for the outcomes of
// p.Owner being written through this Store (see lockOwner).
func (s *Store) MessageExtendLease(ctx context.Context, p outbox.MessageExtendLeaseParams) (outbox.ExtendLeaseResult, error) {
	var res outbox.ExtendLeaseResult
	if err := p.Validate(); err != nil {
		return res, err
	}
	if len(p.Leases) == 0 {
		return res, nil
	}
	now := s.now(p.Now)
	unlock, err := s.lockOwner(ctx, p.Owner)
	if err != nil {
		return res, fmt.Errorf("mongo: extend lease: %w", err)
	}
	defer unlock()
	op := token()
	ups := make([]fenced, len(p.Leases))
	ids := make(bson.A, len(p.Leases))
	for i, l := range p.Leases {
		ups[i] = fenced{id: l.ID, filter: fence(p.Owner, l.Attempt, l.ClaimToken),
			update: bson.D{{Key: "$set", Value: bson.D{{Key: "claimed_at", Value: now}, {Key: "hop", Value: op}}}}}
		ids[i] = l.ID
	}
	matched, err := s.updateFenced(ctx, ups)
	if err != nil {
		return res, fmt.Errorf("mongo: extend lease: %w", err)
	}
	if matched == int64(len(p.Leases)) {
		return res, nil
	}
	var got []struct {
		ID string `bson:"_id"`
	}
	cur, err := s.msgs.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "hop", Value: op}},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return res, fmt.Errorf("mongo: extend lease: %w", err)
	}
	if err := cur.All(ctx, &got); err != nil {
		return res, fmt.Errorf("mongo: extend lease: %w", err)
	}
	extended := make(map[string]bool, len(got))
	for _, g := range got {
		extended[g.ID] = true
	}
	for _, l := range p.Leases {
		if !extended[l.ID] {
			res.LeaseLost = append(res.LeaseLost, l.ID)
		}
	}
	return res, nil
}
