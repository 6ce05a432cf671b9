package mongo

import (
	"context"
	"fmt"
	"sort"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

// claimRounds bounds how many times one claim looks for further groups
// when the ones it found were blocked.
const claimRounds = 3

// MessageClaim implements outbox.Store. It leases up to p.Limit due PENDING
// messages to p.Owner (PROCESSING, Attempts+1, ClaimedAt = Now) and returns
// them in Seq order, keeping FIFO per (tenant, topic, group) across any
// number of processes.
//
// It is built from single-document atomic operations only:
//
//  1. find candidates: due unordered messages, and the groups with due
//     messages (oldest first), leaving out what a pause covers;
//  2. lock each candidate by inserting a lock document whose unique _id
//     names the group (or the unordered message): one insert succeeds,
//     the others fail with a duplicate key, so one claimer at a time works
//     on a group;
//  3. under the locks, read each group's open messages in Seq order and take
//     the run of PENDING due messages from its head (nothing when the head
//     is PROCESSING or waits for a retry);
//  4. lease them with one bulk write, fenced by status and attempt count,
//     and read back the ones that carry this claim's token (when a write
//     or the read fails, the messages already leased are given back,
//     PENDING with the attempt uncounted, before the error returns);
//  5. delete the locks.
//
// Enqueue takes the same group lock outside a transaction, so a claim
// never sees a group's later message before an earlier one.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	now := s.now(p.Now)
	owner := token()
	var locked []string
	defer func() { s.unlock(context.WithoutCancel(ctx), locked, owner) }()

	due := bson.D{
		{Key: "status", Value: string(outbox.StatusPending)},
		{Key: "next_at", Value: bson.D{{Key: "$lte", Value: now}}},
	}
	if len(p.Topics) > 0 {
		due = append(due, bson.E{Key: "topic", Value: bson.D{{Key: "$in", Value: p.Topics}}})
	}
	paused, err := s.notPaused(ctx)
	if err != nil {
		return nil, fmt.Errorf("mongo: claim: %w", err)
	}
	due = append(due, paused...)
	var cands []msgDoc

	// Unordered messages: the oldest due ones, each under its own lock.
	unordered := append(bson.D{{Key: "gkey", Value: ""}}, due...)
	var heads []msgDoc
	if err := s.findAll(ctx, unordered, &heads, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).
		SetLimit(int64(p.Limit)).SetProjection(bson.D{{Key: "_id", Value: 1}})); err != nil {
		return nil, fmt.Errorf("mongo: claim: %w", err)
	}
	if len(heads) > 0 {
		keys := make([]string, len(heads))
		for i := range heads {
			keys[i] = lockKeyMessage(heads[i].ID)
		}
		won, err := s.tryLock(ctx, keys, owner)
		if err != nil {
			return nil, fmt.Errorf("mongo: claim: %w", err)
		}
		locked = append(locked, won...)
		if len(won) > 0 {
			ids := make(bson.A, len(won))
			for i, k := range won {
				ids[i] = k[1:]
			}
			var fresh []msgDoc
			if err := s.findAll(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, due...), &fresh); err != nil {
				return nil, fmt.Errorf("mongo: claim: %w", err)
			}
			cands = append(cands, fresh...)
		}
	}

	// Ordered groups: the claimable prefix of each group whose lock this
	// claim holds.
	seenGroups := bson.A{}
	ordered := 0
	for round := 0; round < claimRounds && ordered < p.Limit; round++ {
		want := p.Limit + 16
		groups, err := s.dueGroups(ctx, due, seenGroups, want)
		if err != nil {
			return nil, fmt.Errorf("mongo: claim: groups: %w", err)
		}
		if len(groups) == 0 {
			break
		}
		keys := make([]string, len(groups))
		for i, g := range groups {
			keys[i] = lockKeyGroup(g)
			seenGroups = append(seenGroups, g)
		}
		won, err := s.tryLock(ctx, keys, owner)
		if err != nil {
			return nil, fmt.Errorf("mongo: claim: %w", err)
		}
		locked = append(locked, won...)
		if len(won) > 0 {
			gks := make(bson.A, len(won))
			for i, k := range won {
				gks[i] = k[1:]
			}
			var open []msgDoc
			err := s.findAll(ctx, bson.D{{Key: "gkey", Value: bson.D{{Key: "$in", Value: gks}}}, {Key: "fin", Value: false}}, &open,
				options.Find().SetSort(bson.D{{Key: "gkey", Value: 1}, {Key: "seq", Value: 1}}))
			if err != nil {
				return nil, fmt.Errorf("mongo: claim: group heads: %w", err)
			}
			blocked := ""
			for i := range open {
				d := &open[i]
				if d.GKey == blocked {
					continue
				}
				if d.Status != string(outbox.StatusPending) || d.NextAt.After(now) {
					blocked = d.GKey // the run of this group ends here
					continue
				}
				cands = append(cands, *d)
				ordered++
			}
		}
		if len(groups) < want {
			break
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	// Cutting the merged list at Limit keeps a prefix of every group.
	sort.Slice(cands, func(i, j int) bool { return cands[i].Seq < cands[j].Seq })
	cands = cands[:min(len(cands), p.Limit)]

	// From here on the leases are written and must be returned: a
	// cancelled ctx would otherwise leave messages PROCESSING that nobody
	// holds until their lease expires.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	op := token()
	models := make([]mongo.WriteModel, len(cands))
	ids := make(bson.A, len(cands))
	for i, d := range cands {
		ids[i] = d.ID
		models[i] = mongo.NewUpdateOneModel().
			SetFilter(bson.D{{Key: "_id", Value: d.ID}, {Key: "status", Value: string(outbox.StatusPending)}, {Key: "attempts", Value: d.Attempts}}).
			SetUpdate(bson.D{
				{Key: "$set", Value: bson.D{
					{Key: "status", Value: string(outbox.StatusProcessing)}, {Key: "claimed_by", Value: p.Owner},
					{Key: "claimed_at", Value: now}, {Key: "updated_at", Value: now}, {Key: "op", Value: op},
				}},
				{Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}},
			})
	}
	if _, err := s.bulk(ctx, models); err != nil {
		s.unlease(ids, op)
		return nil, fmt.Errorf("mongo: claim: lease: %w", err)
	}
	var got []msgDoc
	if err := s.findAll(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "op", Value: op}}, &got,
		options.Find().SetSort(bson.D{{Key: "seq", Value: 1}})); err != nil {
		s.unlease(ids, op)
		return nil, fmt.Errorf("mongo: claim: read back: %w", err)
	}
	out := make([]outbox.Message, len(got))
	for i := range got {
		out[i] = got[i].message()
	}
	return out, nil
}

// unlease gives back, PENDING with the attempt uncounted, the messages
// among ids that a failed claim (token op) leased before its error: they
// are not returned, so nobody would publish them until their lease
// expired. When this fails too (the server is gone), recovery takes them
// back once the lease expires.
func (s *Store) unlease(ids bson.A, op string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.msgs.UpdateMany(ctx,
		bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "op", Value: op}, {Key: "status", Value: string(outbox.StatusProcessing)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: string(outbox.StatusPending)}, {Key: "updated_at", Value: s.now(time.Time{})}}},
			{Key: "$inc", Value: bson.D{{Key: "attempts", Value: -1}}}, unsetLease})
	if err != nil {
		s.log.Warn("mongo: claim failed after leasing some messages; they wait for their lease to expire", "error", err)
	}
}

// maxGroupScan bounds the due messages one look for groups reads.
const maxGroupScan = 5000

// dueGroups returns up to want keys of groups, other than skip, that have
// due PENDING messages, oldest first. It reads the group keys of due
// messages in Seq order, at most 20 per wanted group and maxGroupScan in
// all, in one batch (no cursor is left open on the server).
func (s *Store) dueGroups(ctx context.Context, due bson.D, skip bson.A, want int) ([]string, error) {
	n := int32(min(maxGroupScan, 20*want))
	f := append(bson.D{{Key: "gkey", Value: bson.D{{Key: "$ne", Value: ""}, {Key: "$nin", Value: skip}}}}, due...)
	var docs []struct {
		GKey string `bson:"gkey"`
	}
	if err := s.findAll(ctx, f, &docs, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).
		SetProjection(bson.D{{Key: "gkey", Value: 1}, {Key: "_id", Value: 0}}).SetLimit(int64(n)).SetBatchSize(n)); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, d := range docs {
		if len(out) == want {
			break
		}
		if d.GKey != "" && !seen[d.GKey] {
			seen[d.GKey] = true
			out = append(out, d.GKey)
		}
	}
	return out, nil
}

// bulkChunk is the most updates one bulk write sends. FerretDB v1 over
// PostgreSQL can hold a connection per write of a command until the
// command ends, and deadlocks its own pool when those add up to its size.
const bulkChunk = 8

// bulk runs models as unordered bulk writes of at most bulkChunk updates
// and returns how many documents matched.
func (s *Store) bulk(ctx context.Context, models []mongo.WriteModel) (int64, error) {
	var matched int64
	for start := 0; start < len(models); start += bulkChunk {
		r, err := s.msgs.BulkWrite(ctx, models[start:min(start+bulkChunk, len(models))], options.BulkWrite().SetOrdered(false))
		if err != nil {
			return matched, err
		}
		matched += r.MatchedCount
	}
	return matched, nil
}

// findAll reads every matching message; results come in large batches so
// that no server cursor stays open between round trips.
func (s *Store) findAll(ctx context.Context, filter any, into any, opts ...options.Lister[options.FindOptions]) error {
	opts = append([]options.Lister[options.FindOptions]{options.Find().SetBatchSize(10000)}, opts...)
	cur, err := s.msgs.Find(ctx, filter, opts...)
	if err != nil {
		return err
	}
	return cur.All(ctx, into)
}
