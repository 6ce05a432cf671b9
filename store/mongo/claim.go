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
//  1. find candidates: one read of the due messages in Seq order (their
//     IDs and group keys) gives the oldest unordered messages and the
//     groups with due messages, leaving out what a pause covers;
//  2. lock each candidate by inserting a lock document whose unique _id
//     names the group (or the unordered message), all in one insert: one
//     insert of each _id succeeds, the others fail with a duplicate key,
//     so one claimer at a time works on a group;
//  3. under the locks, read in one query the locked unordered messages and
//     each locked group's open messages in Seq order, and take the run of
//     PENDING due messages from each group's head (nothing when the head
//     is PROCESSING or waits for a retry): at most Options.ClaimPerGroup
//     of each group while other groups fill the claim, more of the oldest
//     groups when the claim has room left;
//  4. lease them with one bulk write, fenced by status and attempt count
//     (see updateFenced); when every lease applied, the claimed messages
//     are the ones read under the locks, else the ones that carry this
//     claim's token are read back (when a write or the read fails, the
//     messages already leased are given back, PENDING with the attempt
//     uncounted, before the error returns; see unlease);
//  5. delete the locks, in one delete.
//
// That is six round trips in all, the read of the pauses included, whatever
// the number of messages, when the groups found were not blocked.
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

	due, err := s.dueFilter(ctx, p.Topics, now)
	if err != nil {
		return nil, fmt.Errorf("mongo: claim: %w", err)
	}
	cands, err := s.lockCandidates(ctx, due, p.Limit, now, owner, &locked)
	if err != nil {
		return nil, fmt.Errorf("mongo: claim: %w", err)
	}
	if len(cands) == 0 {
		return nil, nil
	}
	// Cutting the merged list at Limit keeps a prefix of every group.
	sort.Slice(cands, func(i, j int) bool { return cands[i].Seq < cands[j].Seq })
	cands = cands[:min(len(cands), p.Limit)]
	out, err := s.lease(ctx, cands, p.Owner, now)
	if err != nil {
		return nil, fmt.Errorf("mongo: claim: %w", err)
	}
	s.tenants.put(out)
	return out, nil
}

// dueFilter selects the PENDING messages due at now, of topics (all when
// empty), leaving out what a pause covers (it reads the pauses).
func (s *Store) dueFilter(ctx context.Context, topics []string, now time.Time) (bson.D, error) {
	due := bson.D{
		{Key: "status", Value: string(outbox.StatusPending)},
		{Key: "next_at", Value: bson.D{{Key: "$lte", Value: now}}},
	}
	if len(topics) > 0 {
		due = append(due, bson.E{Key: "topic", Value: bson.D{{Key: "$in", Value: topics}}})
	}
	paused, err := s.notPaused(ctx)
	if err != nil {
		return nil, err
	}
	return append(due, paused...), nil
}

// lockCandidates is steps 1 to 3 of MessageClaim: it finds candidates
// matching due, locks them (adding the locks it won to *locked, which the
// caller deletes) and returns the claimable messages under those locks, in
// no particular order (see takeRuns): the locked unordered messages still
// due, and each locked group's run of PENDING due messages from its head.
// While fewer than limit ordered messages were found (a group's run
// counting up to Options.ClaimPerGroup) and the groups read filled the
// page, it looks for further groups, up to claimRounds rounds.
func (s *Store) lockCandidates(ctx context.Context, due bson.D, limit int, now time.Time, owner string, locked *[]string) ([]msgDoc, error) {
	var loose []msgDoc
	var runs [][]msgDoc
	seenGroups := bson.A{}
	ordered := 0
	for round := 0; round < claimRounds && ordered < limit; round++ {
		want := limit + 16
		var heads, groups []string
		var err error
		if round == 0 {
			heads, groups, err = s.scanDue(ctx, due, limit, want)
		} else {
			groups, err = s.dueGroups(ctx, due, seenGroups, want)
		}
		if err != nil {
			return nil, err
		}
		if len(heads) == 0 && len(groups) == 0 {
			break
		}
		keys := make([]string, 0, len(heads)+len(groups))
		for _, id := range heads {
			keys = append(keys, lockKeyMessage(id))
		}
		for _, g := range groups {
			keys = append(keys, lockKeyGroup(g))
			seenGroups = append(seenGroups, g)
		}
		won, err := s.tryLock(ctx, keys, owner)
		if err != nil {
			return nil, err
		}
		*locked = append(*locked, won...)
		l, r, err := s.readLocked(ctx, won, now, limit)
		if err != nil {
			return nil, err
		}
		loose, runs = append(loose, l...), append(runs, r...)
		for _, run := range r {
			ordered += min(len(run), s.opts.ClaimPerGroup)
		}
		if len(groups) < want {
			break
		}
	}
	return takeRuns(loose, runs, limit, s.opts.ClaimPerGroup), nil
}

// takeRuns returns a claim's candidates: the unordered messages loose, and
// from each group's run (in Seq order, from its head) its first per
// messages; then, while these are fewer than limit, the rest of the runs
// cut at per, oldest group first, until limit. So one group contributes at
// most per messages while other groups fill the claim, and a deep backlog
// in a few groups still fills it. Every group contributes a prefix of its
// run.
func takeRuns(loose []msgDoc, runs [][]msgDoc, limit, per int) []msgDoc {
	out := loose
	for _, run := range runs {
		out = append(out, run[:min(len(run), per)]...)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i][0].Seq < runs[j][0].Seq })
	for _, run := range runs {
		room := limit - len(out)
		if room <= 0 {
			break
		}
		if len(run) > per {
			out = append(out, run[per:min(len(run), per+room)]...)
		}
	}
	return out
}

// readLocked is step 3 of MessageClaim: under the locks won (message and
// group lock keys), it reads in one query the locked unordered messages
// and each locked group's open messages in Seq order, and returns those
// still claimable at now: the unordered messages still PENDING and due
// (loose), and each group's run of PENDING due messages from its head, at
// most limit long (nothing when the head is PROCESSING or waits for a
// retry).
func (s *Store) readLocked(ctx context.Context, won []string, now time.Time, limit int) (loose []msgDoc, runs [][]msgDoc, err error) {
	var ids, gks bson.A
	for _, k := range won {
		if k[0] == 'm' {
			ids = append(ids, k[1:])
		} else {
			gks = append(gks, k[1:])
		}
	}
	var or bson.A
	if len(ids) > 0 {
		or = append(or, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	}
	if len(gks) > 0 {
		or = append(or, bson.D{{Key: "gkey", Value: bson.D{{Key: "$in", Value: gks}}}})
	}
	if len(or) == 0 {
		return nil, nil, nil
	}
	filter := bson.D{{Key: "fin", Value: false}}
	if len(or) == 1 {
		filter = append(filter, or[0].(bson.D)...)
	} else {
		filter = append(filter, bson.E{Key: "$or", Value: or})
	}
	var open []msgDoc
	if err := s.findAll(ctx, filter, &open, options.Find().SetSort(bson.D{{Key: "gkey", Value: 1}, {Key: "seq", Value: 1}})); err != nil {
		return nil, nil, fmt.Errorf("group heads: %w", err)
	}
	blocked := ""
	for i := range open {
		d := &open[i]
		if d.GKey == "" {
			// A locked unordered message, read again under its lock.
			if d.Status == string(outbox.StatusPending) && !d.NextAt.After(now) {
				loose = append(loose, *d)
			}
			continue
		}
		if d.GKey == blocked {
			continue
		}
		if d.Status != string(outbox.StatusPending) || d.NextAt.After(now) {
			blocked = d.GKey // the run of this group ends here
			continue
		}
		if n := len(runs); n > 0 && runs[n-1][0].GKey == d.GKey {
			if len(runs[n-1]) < limit {
				runs[n-1] = append(runs[n-1], *d)
			}
			continue
		}
		runs = append(runs, []msgDoc{*d})
	}
	return loose, runs, nil
}

// lease is step 4 of MessageClaim: it leases cands (in Seq order) to owner
// at now with one bulk write fenced by status and attempt count, and
// returns the messages leased. When a write or the read back fails, the
// messages already leased are given back (unlease) before the error
// returns.
func (s *Store) lease(ctx context.Context, cands []msgDoc, owner string, now time.Time) ([]outbox.Message, error) {
	// From here on the leases are written and must be returned: a
	// cancelled ctx would otherwise leave messages PROCESSING that nobody
	// holds until their lease expires.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	op := token()
	ups := make([]fenced, len(cands))
	ids := make(bson.A, len(cands))
	lease := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "status", Value: string(outbox.StatusProcessing)}, {Key: "claimed_by", Value: owner},
			{Key: "claimed_at", Value: now}, {Key: "updated_at", Value: now}, {Key: "op", Value: op},
		}},
		{Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}},
	}
	for i, d := range cands {
		ids[i] = d.ID
		// void: a give-back of this claim (unlease) voids what it did not
		// lease yet, against a write the server runs after the client
		// gave up on it.
		ups[i] = fenced{id: d.ID, update: lease, filter: bson.D{{Key: "status", Value: string(outbox.StatusPending)},
			{Key: "attempts", Value: d.Attempts}, {Key: "void", Value: bson.D{{Key: "$ne", Value: op}}}}}
	}
	matched, err := s.updateFenced(ctx, ups)
	if err != nil {
		s.unlease(ids, op)
		return nil, fmt.Errorf("lease: %w", err)
	}
	got := cands
	if matched == int64(len(cands)) {
		// Every lease applied: the messages are the ones read under the
		// locks, as the lease changed them.
		for i := range got {
			d := &got[i]
			d.Status, d.ClaimedBy, d.ClaimedAt, d.UpdatedAt, d.Op = string(outbox.StatusProcessing), owner, &now, now, op
			d.Attempts++
		}
	} else {
		got = nil
		if err := s.findAll(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "op", Value: op}}, &got,
			options.Find().SetSort(bson.D{{Key: "seq", Value: 1}})); err != nil {
			s.unlease(ids, op)
			return nil, fmt.Errorf("read back: %w", err)
		}
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
// expired. It first voids the claim on all of them (void = op, which the
// lease's filter excludes): a lease write the client gave up on (a timeout,
// a cut connection) may still run on the server after this give-back, and
// then leases nothing. When this fails too (the server is gone), recovery
// takes them back once the lease expires.
func (s *Store) unlease(ids bson.A, op string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.msgs.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "void", Value: op}}}})
	if err != nil {
		s.log.Warn("mongo: voiding a failed claim failed", "error", err)
	}
	_, err = s.msgs.UpdateMany(ctx,
		bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "op", Value: op}, {Key: "status", Value: string(outbox.StatusProcessing)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: string(outbox.StatusPending)}, {Key: "updated_at", Value: s.now(time.Time{})}}},
			{Key: "$inc", Value: bson.D{{Key: "attempts", Value: -1}}}, unsetLease})
	if err != nil {
		s.log.Warn("mongo: claim failed after leasing some messages; they wait for their lease to expire", "error", err)
	}
}

// scanDue reads the due messages in Seq order (their IDs and group keys,
// at most 20 per wanted group and maxGroupScan in all, in one batch) and
// returns the IDs of the oldest limit unordered ones and the keys of the
// oldest want groups. When the read was cut off before it found limit
// unordered messages, these are looked for on their own.
func (s *Store) scanDue(ctx context.Context, due bson.D, limit, want int) (heads, groups []string, err error) {
	n := int32(min(maxGroupScan, 20*want))
	var docs []struct {
		ID   string `bson:"_id"`
		GKey string `bson:"gkey"`
	}
	if err := s.findAll(ctx, due, &docs, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).
		SetProjection(bson.D{{Key: "gkey", Value: 1}}).SetLimit(int64(n)).SetBatchSize(n)); err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	for _, d := range docs {
		switch {
		case d.GKey == "":
			if len(heads) < limit {
				heads = append(heads, d.ID)
			}
		case len(groups) < want && !seen[d.GKey]:
			seen[d.GKey] = true
			groups = append(groups, d.GKey)
		}
	}
	if len(docs) == int(n) && len(heads) < limit {
		var more []msgDoc
		if err := s.findAll(ctx, append(bson.D{{Key: "gkey", Value: ""}}, due...), &more, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).
			SetLimit(int64(limit)).SetProjection(bson.D{{Key: "_id", Value: 1}})); err != nil {
			return nil, nil, err
		}
		heads = heads[:0]
		for _, d := range more {
			heads = append(heads, d.ID)
		}
	}
	return heads, groups, nil
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

// fenced is a fenced update of one message: the conditions besides its
// _id, and the update.
type fenced struct {
	id     string
	filter bson.D
	update bson.D
}

// Bulk writes are sent in commands of at most maxStatements updates, each
// over at most maxIDs messages.
const (
	maxStatements = 200
	maxIDs        = 1000
)

// updateFenced applies ups and returns how many messages matched. The
// updates with the same conditions and the same update are merged into one
// multi-document update over their _ids, and every update is sent as a
// multi-document one: on MongoDB each message still matches (or not) by
// itself, atomically, as the filter names it by its unique _id; FerretDB
// v1.24 keeps one PostgreSQL connection per single-document update of a
// command until the whole command ends (and takes one more for each
// write), so a few concurrent bulk writes of single-document updates
// exhausted its pool and hung the server for good (issue #12), while a
// multi-document update reads its matches to the end, one after the other,
// on one connection. All statements go out in one unordered bulk write
// (more than maxStatements in more).
func (s *Store) updateFenced(ctx context.Context, ups []fenced) (int64, error) {
	type stmt struct {
		filter, update bson.D
		ids            bson.A
	}
	var stmts []*stmt
	byKey := map[string]*stmt{}
	for _, u := range ups {
		key, err := bson.Marshal(bson.D{{Key: "f", Value: u.filter}, {Key: "u", Value: u.update}})
		if err != nil {
			return 0, err
		}
		st := byKey[string(key)]
		if st == nil || len(st.ids) == maxIDs {
			st = &stmt{filter: u.filter, update: u.update}
			byKey[string(key)] = st
			stmts = append(stmts, st)
		}
		st.ids = append(st.ids, u.id)
	}
	models := make([]mongo.WriteModel, len(stmts))
	for i, st := range stmts {
		var id any = bson.D{{Key: "$in", Value: st.ids}}
		if len(st.ids) == 1 {
			id = st.ids[0]
		}
		models[i] = mongo.NewUpdateManyModel().SetFilter(append(bson.D{{Key: "_id", Value: id}}, st.filter...)).SetUpdate(st.update)
	}
	var matched int64
	for start := 0; start < len(models); start += maxStatements {
		r, err := s.msgs.BulkWrite(ctx, models[start:min(start+maxStatements, len(models))], options.BulkWrite().SetOrdered(false))
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
