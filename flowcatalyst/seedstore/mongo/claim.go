package mongo

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// claimBudget is how long a claim goes on taking further documents
// once it has leased some (at least as long as it took to find the
// groups): on a slow server (FerretDB scans the collection for
// every command and writes each document of an update on its own) the
// first rows are handed out, and sent, while the next claim (at once,
// through Wakeups) takes the rest.
const claimBudget = 250 * time.Millisecond

// firstChunk is the first update of a Store's first claim: small, so
// that the first documents on a fresh collection are sent as soon as they
// are leased, however slow the server.
const firstChunk = 8

// claimPace decides when a claim has leased enough for now: a Store's
// first claim hands out its first chunk at once; later claims go on taking
// documents for their budget after their first lease (and hand out what
// they have when it is up; Wakeups brings the next claim at once).
type claimPace struct {
	first    bool
	budget   time.Duration
	leasedAt time.Time
}

// leased records that the claim leased something.
func (p *claimPace) leased() {
	if p.leasedAt.IsZero() {
		p.leasedAt = time.Now()
	}
}

// enough reports whether the claim should hand out what it leased.
func (p *claimPace) enough() bool {
	return !p.leasedAt.IsZero() && (p.first || time.Since(p.leasedAt) > p.budget)
}

// MessageClaim leases up to p.Limit due documents: status PROCESSING,
// processedAt = the server's clock, read once per claim (p.Now is not
// used). The collections take turns to go first (so neither starves), each
// taking what the limit leaves, and it returns the documents ordered by
// createdAt, then id. How a claim works on MongoDB is in the package doc.
//
// ctx is checked before the claim starts; once started, the claim runs
// (at most 30 s) until it has leased enough for now even if ctx ends, then
// returns the documents it leased: a claim whose caller has gone stops at
// its next step.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	ctx, cancel, order, err := s.core.BeginClaim(ctx, p)
	if err != nil || len(order) == 0 {
		return nil, err
	}
	defer cancel()
	now, err := s.serverNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("seedstore: claim: %w", err)
	}
	var out []outbox.Message
	cut := false
	for i, topic := range order {
		t := s.tableOf(topic)
		remaining := p.Limit - len(out)
		if remaining == 0 {
			if i == 1 {
				s.core.NextTurn()
			}
			break
		}
		msgs, more, err := s.claimTable(ctx, t, remaining, p.Owner, now)
		cut = cut || more
		if err != nil {
			if len(out) > 0 {
				// Documents already leased are written: hand them out.
				s.core.Log.WarnContext(ctx, "seedstore: claim failed", "table", t.raw, "err", err)
				break
			}
			return nil, err
		}
		if !s.claimed.Load() && len(msgs) > 0 && i == 0 {
			// A Store's first claim hands out its first documents at
			// once (see claimPace); the other collection comes next.
			out, cut = append(out, msgs...), true
			s.core.NextTurn()
			break
		}
		out = append(out, msgs...)
	}
	if len(out) > 0 {
		s.claimed.Store(true)
	}
	if cut && len(out) < p.Limit {
		s.core.WakeUp()
	}
	seedcore.SortClaimed(out)
	return out, nil
}

// claimTable claims up to limit documents of t at now (the server's
// clock, read once per MessageClaim); see the package doc. It reports whether it
// stopped early (claimPace) with groups left to try: the processor is then
// woken to claim again at once.
func (s *Store) claimTable(ctx context.Context, t *table, limit int, owner string, now time.Time) ([]outbox.Message, bool, error) {
	fail := func(err error) ([]outbox.Message, bool, error) {
		return nil, false, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	// Round robin: start after the group this Store claimed from last.
	s.mu.Lock()
	last, fit := t.lastGroup, t.groupsFit
	s.mu.Unlock()
	began := time.Now()
	groups, err := s.groups(ctx, t, last, fit, min(groupWindow*limit, 20000))
	if err != nil {
		return fail(err)
	}
	// The budget is at least what finding the groups took, so that on a
	// slow server the claim's fixed part stays at most half of it.
	budget := max(s.budget, time.Since(began))
	token := owner + ":" + hex.EncodeToString([]byte(strconv.FormatInt(time.Now().UnixNano(), 36)))
	var out []outbox.Message
	var claimed []time.Time
	pace := &claimPace{first: !s.claimed.Load(), budget: budget}
	cut := false
	// Locks are taken a batch of groups at a time, the batches growing
	// from lockChunk: a claim that needs few groups locks few, one
	// that needs many makes few round trips.
	size := lockChunk
	for start := 0; start < len(groups) && len(out) < limit; {
		if len(out) > 0 && (pace.enough() || seedcore.CallerGone(ctx)) {
			cut = !seedcore.CallerGone(ctx)
			break // hand out what is leased; the next claim takes more
		}
		if seedcore.CallerGone(ctx) {
			return nil, false, context.Canceled // nothing leased yet
		}
		chunk := groups[start:min(start+size, len(groups))]
		start += len(chunk)
		size = min(2*size, maxLockChunk)
		won, err := s.lockGroups(ctx, t, chunk, token, now)
		if err != nil {
			if len(out) > 0 {
				break
			}
			return fail(err)
		}
		for _, g := range won {
			if len(out) >= limit {
				break
			}
			if len(out) > 0 && (pace.enough() || seedcore.CallerGone(ctx)) {
				cut = !seedcore.CallerGone(ctx) // this group and the rest untried
				start = len(groups)
				break
			}
			msgs, err := s.claimGroup(ctx, t, g, min(limit-len(out), s.core.Chunk), now, owner, pace)
			if err != nil {
				s.unlockGroups(context.WithoutCancel(ctx), t, won, token)
				if len(out) > 0 {
					s.core.Log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
					s.core.Remember(t.topic, out, claimed)
					return out, false, nil
				}
				return fail(err)
			}
			for range msgs {
				claimed = append(claimed, now)
			}
			out = append(out, msgs...)
			if len(msgs) > 0 {
				s.mu.Lock()
				t.lastGroup = g
				s.mu.Unlock()
			}
		}
		s.unlockGroups(context.WithoutCancel(ctx), t, won, token)
	}
	if s.core.UnorderedNull && len(out) < limit && !seedcore.CallerGone(ctx) {
		msgs, err := s.claimUnordered(ctx, t, limit-len(out), now, owner, pace)
		if err != nil && len(out) == 0 {
			return fail(err)
		}
		if err != nil {
			s.core.Log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
		}
		for range msgs {
			claimed = append(claimed, now)
		}
		out = append(out, msgs...)
	}
	s.core.Remember(t.topic, out, claimed)
	return out, cut && len(out) < limit, nil
}

// claimGroup leases, under the group's lock, the run of due PENDING
// documents at the head of group g's unfinished documents, at most n:
// none while a document of g is PROCESSING. One read finds both: the
// group's PENDING and PROCESSING documents sorted by status descending
// ("PROCESSING" sorts after "PENDING", so a document in flight comes
// first), then createdAt, _id. The group is an equality (which FerretDB
// also pushes down to its backend).
func (s *Store) claimGroup(ctx context.Context, t *table, g *string, n int, now time.Time, owner string, pace *claimPace) ([]outbox.Message, error) {
	rows, err := findRows(ctx, t.coll, bson.D{
		{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusPending, StatusProcessing}}}}, groupFilter(g),
	}, options.Find().SetSort(bson.D{{Key: "status", Value: -1}, {Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}).SetLimit(int64(n)))
	if err != nil {
		return nil, err
	}
	var take []seedcore.Row
	for _, r := range rows {
		if r.Status != StatusPending {
			break // in flight
		}
		if r.ProcessedAt.Valid && r.ProcessedAt.Time.After(now) {
			break // waits for a retry, and so does the rest of the group
		}
		take = append(take, r)
	}
	if len(take) == 0 {
		return nil, nil
	}
	return s.leaseRows(ctx, t, take, groupFilter(g), now, owner, pace)
}

// leaseRows marks rows (read PENDING under a lock) PROCESSING at now and
// returns those whose update applied. scope narrows the update (the
// group), so that FerretDB pushes its equality filters down.
func (s *Store) leaseRows(ctx context.Context, t *table, take []seedcore.Row, scope bson.E, now time.Time, owner string, pace *claimPace) ([]outbox.Message, error) {
	ids := make([]string, len(take))
	for i := range take {
		ids[i] = take[i].ID
	}
	// One update per writeChunk documents (a Store's first claim starts
	// with firstChunk): once the claim has leased enough, it stops
	// after a chunk, leasing a prefix of the group (the rest waits behind
	// it).
	var matched int64
	done := 0
	for done < len(ids) {
		if done > 0 && (pace.enough() || seedcore.CallerGone(ctx)) {
			break
		}
		size := writeChunk
		if done == 0 && pace.first {
			size = firstChunk
		}
		chunk := ids[done:min(done+size, len(ids))]
		res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusPending}, scope}, idFilter(chunk)...),
			bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusProcessing}, {Key: "processedAt", Value: now}}}})
		if err != nil {
			if done == 0 {
				return nil, err
			}
			s.core.Log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
			break
		}
		pace.leased()
		matched += res.MatchedCount
		done += len(chunk)
	}
	take, ids = take[:done], ids[:done]
	if int(matched) != len(ids) {
		// Something else changed some of them (a lock that expired under a
		// stalled claimer): keep the ones this claim leased.
		fresh, err := findRows(ctx, t.coll, append(bson.D{{Key: "status", Value: StatusProcessing}, scope,
			{Key: "processedAt", Value: now}}, idFilter(ids)...), options.Find().SetSort(byOrder))
		if err != nil {
			return nil, err
		}
		take = fresh
	}
	out := make([]outbox.Message, len(take))
	for i := range take {
		r := take[i]
		r.Status = StatusProcessing
		r.ProcessedAt.Time, r.ProcessedAt.Valid = now, true
		out[i] = s.core.Message(&r, t.topic)
		out[i].ClaimedBy = owner
	}
	return out, nil
}

// claimUnordered claims null-group documents without FIFO
// (Options.UnorderedNullGroup), each under its own lock.
func (s *Store) claimUnordered(ctx context.Context, t *table, limit int, now time.Time, owner string, pace *claimPace) ([]outbox.Message, error) {
	rows, err := findRows(ctx, t.coll, bson.D{
		{Key: "status", Value: StatusPending}, {Key: "messageGroup", Value: nil},
		{Key: "$or", Value: bson.A{bson.D{{Key: "processedAt", Value: nil}}, bson.D{{Key: "processedAt", Value: bson.D{{Key: "$lte", Value: now}}}}}},
	}, options.Find().SetSort(byOrder).SetLimit(int64(limit)))
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	// Each document is locked as a group of its own ("id:" + _id).
	keys := make([]*string, len(rows))
	byKey := map[string]seedcore.Row{}
	for i, r := range rows {
		k := "id:" + r.ID
		keys[i] = &k
		byKey[k] = r
	}
	token := owner + ":u"
	var take []seedcore.Row
	var locked []*string
	for start := 0; start < len(keys); start += lockChunk {
		won, err := s.lockGroups(ctx, t, keys[start:min(start+lockChunk, len(keys))], token, now)
		if err != nil {
			s.unlockGroups(context.WithoutCancel(ctx), t, locked, token)
			return nil, err
		}
		locked = append(locked, won...)
		for _, k := range won {
			take = append(take, byKey[*k])
		}
	}
	defer s.unlockGroups(context.WithoutCancel(ctx), t, locked, token)
	if len(take) == 0 {
		return nil, nil
	}
	// Re-read under the locks: only documents still PENDING.
	ids := make([]string, len(take))
	for i := range take {
		ids[i] = take[i].ID
	}
	nullGroup := bson.E{Key: "messageGroup", Value: nil}
	fresh, err := findRows(ctx, t.coll, append(bson.D{{Key: "status", Value: StatusPending}, nullGroup}, idFilter(ids)...), options.Find().SetSort(byOrder))
	if err != nil || len(fresh) == 0 {
		return nil, err
	}
	return s.leaseRows(ctx, t, fresh, nullGroup, now, owner, pace)
}
