package seedstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultLocksCollection is the collection of the claim locks (and of the
// processor's single-active lease) on MongoDB.
const DefaultLocksCollection = "outbox_processor_locks"

// mongoLockTTL is how long a claim lock of a processor that died blocks its
// group. A claim holds its locks for a few round trips only.
const mongoLockTTL = 30 * time.Second

// mongoChunk bounds the documents one write command names: FerretDB over
// PostgreSQL can deadlock its own connection pool on large write commands
// sent at once by several clients.
const mongoChunk = 100

// mongoClaimBudget is how long a claim goes on taking further groups once
// it has leased some: on a slow server (FerretDB writes each document of
// an update on its own) the first rows are handed out, and sent, while the
// next poll claims the rest.
const mongoClaimBudget = 250 * time.Millisecond

// mongoFirstChunk is the first update of a claim's group: small, so that
// the claim's time budget can cut a large group on a slow server.
const mongoFirstChunk = 8

// mongoLockChunk bounds the lock documents one insert carries.
const mongoLockChunk = 8

// NewMongo returns a Store over db, a MongoDB database holding seed 004's
// collections (Options.EventsTable and Options.DispatchJobsTable name the
// collections) with the seed's documents:
//
//	{
//	    "_id": "0HZXEQ5Y8JY5Z",        // a TSID (an ObjectId is accepted too)
//	    "type": "EVENT",
//	    "messageGroup": "order-123",   // null or missing = the group "default"
//	    "payload": "{...}",            // a JSON string (an embedded document is sent as JSON)
//	    "status": "PENDING",
//	    "retryCount": 0,
//	    "createdAt": ISODate("2025-01-15T10:30:00Z"),
//	    "processedAt": null,
//	    "errorMessage": null
//	}
//
// It does not touch the database; CreateTables creates the seed's index
// {status: 1, messageGroup: 1, createdAt: 1} on both collections and the
// unique lock collection's index.
//
// The behaviour is the PostgreSQL Store's (FIFO per messageGroup, null as
// the group "default", outcomes fenced by the claim time, retries and
// recovery on the database's clock), built from operations that are atomic
// on MongoDB by construction, not from findOneAndUpdate loops:
//
//   - a claim locks each group it works on by inserting a document whose
//     unique _id names the group into Options.LocksCollection (of
//     concurrent inserts exactly one succeeds); under the lock it reads
//     the group's unfinished documents in (createdAt, _id) order and leases
//     the run of due PENDING documents from the head (none while the head
//     is PROCESSING or waits for a retry), then deletes the lock. A lock
//     left by a processor that died expires after 30 s;
//   - groups are visited in turn (round robin by name), not oldest first:
//     the claim reads the groups with PENDING documents through the
//     seed's index (distinct) instead of sorting every PENDING document;
//   - "now" is the server's clock (the hello command's localTime), read
//     once per claim, outcome and recovery, so processors on hosts with
//     skewed clocks agree; times are BSON dates (milliseconds);
//   - an outcome applies only while its document is PROCESSING with the
//     processedAt this Store's claim wrote.
//
// Documents inserted by any client (insertOne with the seed's fields) are
// claimed; Insert has a MongoDB twin, InsertMongo.
func NewMongo(db *mongo.Database, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if opts.LocksCollection == "" {
		opts.LocksCollection = DefaultLocksCollection
	}
	for _, c := range []struct{ field, name string }{
		{"Options.EventsTable", opts.EventsTable}, {"Options.DispatchJobsTable", opts.DispatchJobsTable},
		{"Options.LocksCollection", opts.LocksCollection},
	} {
		if err := checkCollectionName(c.name); err != nil {
			return nil, outbox.InvalidParam(c.field, err.Error())
		}
	}
	if strings.EqualFold(opts.LocksCollection, cmpOr(opts.EventsTable, DefaultEventsTable)) ||
		strings.EqualFold(opts.LocksCollection, cmpOr(opts.DispatchJobsTable, DefaultDispatchJobsTable)) {
		return nil, outbox.InvalidParam("Options.LocksCollection", "must differ from the item collections")
	}
	s, err := newStore(nil, opts, dialectMongo)
	if err != nil {
		return nil, err
	}
	s.mg = &mongoDB{db: db, locks: db.Collection(opts.LocksCollection)}
	for _, t := range s.tables {
		t.coll = db.Collection(t.raw)
	}
	return s, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// CheckCollectionName returns an error matching outbox.ErrInvalidInput when
// name is not a collection name NewMongo accepts: 1 to 120 bytes of UTF-8,
// no '$', no NUL, not starting with "system.".
func CheckCollectionName(name string) error {
	if err := checkCollectionName(name); err != nil {
		return outbox.InvalidParam("collection", err.Error())
	}
	return nil
}

func checkCollectionName(name string) error {
	if name == "" {
		return nil // the default
	}
	if len(name) > 120 || !utf8.ValidString(name) || strings.ContainsAny(name, "$\x00") || strings.HasPrefix(name, "system.") {
		return fmt.Errorf("%q is not a collection name (at most 120 bytes, no $ or NUL, not system.*)", name)
	}
	return nil
}

type mongoDB struct {
	db    *mongo.Database
	locks *mongo.Collection
}

// serverNow returns the server's clock (hello's localTime), truncated to
// the millisecond as BSON dates store it. A server that does not report
// it falls back to this host's clock.
func (s *Store) serverNow(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := s.mg.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, fmt.Errorf("seedstore: server time: %w", err)
	}
	if hello.LocalTime.IsZero() {
		hello.LocalTime = time.Now()
	}
	return hello.LocalTime.UTC().Truncate(time.Millisecond), nil
}

func (s *Store) createTablesMongo(ctx context.Context) error {
	for _, t := range s.tables {
		if _, err := t.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
			Keys:    bson.D{{Key: "status", Value: 1}, {Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}},
			Options: options.Index().SetName("idx_" + t.raw + "_status"),
		}); err != nil {
			return fmt.Errorf("seedstore: create the index of %s: %w", t.raw, err)
		}
	}
	return nil
}

// idFilter matches the documents with one of ids: each as a string and,
// when it is the hex form of an ObjectId, as that ObjectId.
func idFilter(ids []string) bson.D {
	if len(ids) == 1 {
		if _, err := bson.ObjectIDFromHex(ids[0]); err != nil {
			return bson.D{{Key: "_id", Value: ids[0]}}
		}
	}
	in := make(bson.A, 0, len(ids))
	for _, id := range ids {
		in = append(in, id)
		if len(id) == 24 {
			if oid, err := bson.ObjectIDFromHex(id); err == nil {
				in = append(in, oid)
			}
		}
	}
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}
}

// mongoRow decodes a seed document leniently: the seed's types, plus what
// other clients commonly write (ObjectId ids, numbers of any width,
// embedded payload documents, RFC 3339 strings for dates).
func mongoRow(raw bson.Raw) (row, error) {
	var r row
	idv, err := raw.LookupErr("_id")
	if err != nil {
		return r, errors.New("document without _id")
	}
	switch idv.Type {
	case bson.TypeString:
		r.id = idv.StringValue()
	case bson.TypeObjectID:
		r.id = idv.ObjectID().Hex()
	default:
		r.id = idv.String()
	}
	str := func(key string) (string, bool) {
		v, err := raw.LookupErr(key)
		if err != nil || v.Type == bson.TypeNull || v.Type == bson.TypeUndefined {
			return "", false
		}
		if s, ok := v.StringValueOK(); ok {
			return s, true
		}
		return v.String(), true
	}
	date := func(key string) (time.Time, bool) {
		v, err := raw.LookupErr(key)
		if err != nil {
			return time.Time{}, false
		}
		switch v.Type {
		case bson.TypeDateTime:
			return time.UnixMilli(v.DateTime()).UTC(), true
		case bson.TypeTimestamp:
			sec, _ := v.Timestamp()
			return time.Unix(int64(sec), 0).UTC(), true
		case bson.TypeString:
			t, err := time.Parse(time.RFC3339Nano, v.StringValue())
			return t.UTC(), err == nil
		}
		return time.Time{}, false
	}
	r.typ, _ = str("type")
	if g, ok := str("messageGroup"); ok {
		r.group.String, r.group.Valid = g, true
	}
	if v, err := raw.LookupErr("payload"); err == nil {
		switch v.Type {
		case bson.TypeString:
			r.payload = v.StringValue()
		case bson.TypeEmbeddedDocument, bson.TypeArray:
			// Relaxed extended JSON is plain JSON for the usual values.
			var x any
			if err := bson.UnmarshalValue(v.Type, v.Value, &x); err == nil {
				if b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: x}}, false, false); err == nil {
					r.payload = string(b[len(`{"v":`) : len(b)-1])
				}
			}
		}
	}
	r.status, _ = str("status")
	if v, err := raw.LookupErr("retryCount"); err == nil {
		if n, ok := v.AsInt64OK(); ok && n >= 0 && n <= math.MaxInt32 {
			r.retryCount = int(n)
		} else if f, ok := v.DoubleOK(); ok && f >= 0 && f <= math.MaxInt32 {
			r.retryCount = int(f)
		}
	}
	r.createdAt, _ = date("createdAt")
	if t, ok := date("processedAt"); ok {
		r.processedAt.Time, r.processedAt.Valid = t, true
	}
	if e, ok := str("errorMessage"); ok {
		r.errorMessage.String, r.errorMessage.Valid = e, true
	}
	return r, nil
}

func findRows(ctx context.Context, c *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) ([]row, error) {
	opts = append([]options.Lister[options.FindOptions]{options.Find().SetBatchSize(10000)}, opts...)
	cur, err := c.Find(ctx, filter, opts...)
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	var out []row
	for cur.Next(ctx) {
		r, err := mongoRow(cur.Current)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, cur.Err()
}

// byOrder is the order of a group: createdAt, then _id.
var byOrder = bson.D{{Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}

// groupFilter matches the documents of group g (nil: null or missing).
func groupFilter(g *string) bson.E {
	if g == nil {
		return bson.E{Key: "messageGroup", Value: nil}
	}
	return bson.E{Key: "messageGroup", Value: *g}
}

// lockID names the lock of group g of collection coll; the length prefix
// keeps every (collection, group) pair distinct.
func lockID(coll string, g *string) string {
	if g == nil {
		return strconv.Itoa(len(coll)) + ":" + coll + ":null"
	}
	return strconv.Itoa(len(coll)) + ":" + coll + ":g:" + *g
}

// mongoGroupWindow bounds the PENDING documents one claim reads to find
// groups: per limit item, at most this many index entries.
const mongoGroupWindow = 4

// mongoGroups returns groups of t with PENDING documents and none
// PROCESSING, in turn: the null group first (if it has any), then the named
// groups after last by name, wrapping around. It reads at most window
// PENDING documents' groups, in the seed's index order, so its cost does
// not grow with the backlog.
func (s *Store) mongoGroups(ctx context.Context, t *table, last *string, window int) ([]*string, error) {
	names := func(filter bson.D, limit int) ([]string, error) {
		cur, err := t.coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}}).
			SetProjection(bson.D{{Key: "messageGroup", Value: 1}}).SetLimit(int64(limit)).SetBatchSize(int32(min(limit, 10000))))
		if err != nil {
			return nil, err
		}
		defer cur.Close(ctx)
		var out []string
		for cur.Next(ctx) {
			if g, ok := cur.Current.Lookup("messageGroup").StringValueOK(); ok && (len(out) == 0 || out[len(out)-1] != g) {
				out = append(out, g)
			}
		}
		return out, cur.Err()
	}
	pending := bson.E{Key: "status", Value: StatusPending}
	from := ""
	if last != nil {
		from = *last
	}
	named, err := names(bson.D{pending, {Key: "messageGroup", Value: bson.D{{Key: "$gt", Value: from}}}}, window)
	if err != nil {
		return nil, err
	}
	if last != nil && len(named) < window {
		// Wrap around.
		more, err := names(bson.D{pending, {Key: "messageGroup", Value: bson.D{{Key: "$lte", Value: from}}}}, window)
		if err != nil {
			return nil, err
		}
		named = append(named, more...)
	}
	// Groups with a PROCESSING document wait (checked again under the
	// lock); this read is bounded by what is in flight.
	busy := map[string]bool{}
	nullBusy := false
	cur, err := t.coll.Find(ctx, bson.D{{Key: "status", Value: StatusProcessing}}, options.Find().SetProjection(bson.D{{Key: "messageGroup", Value: 1}}).SetBatchSize(10000))
	if err != nil {
		return nil, err
	}
	for cur.Next(ctx) {
		if g, ok := cur.Current.Lookup("messageGroup").StringValueOK(); ok {
			busy[g] = true
		} else {
			nullBusy = true
		}
	}
	err = cur.Err()
	_ = cur.Close(ctx)
	if err != nil {
		return nil, err
	}
	var out []*string
	if !s.unorderedNull && !nullBusy {
		// The sort puts null first, but a $gt bound leaves it out: ask.
		err := t.coll.FindOne(ctx, bson.D{pending, {Key: "messageGroup", Value: nil}},
			options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
		switch {
		case err == nil:
			out = append(out, nil)
		case !errors.Is(err, mongo.ErrNoDocuments):
			return nil, err
		}
	}
	seen := map[string]bool{}
	for i := range named {
		if g := named[i]; !busy[g] && !seen[g] {
			seen[g] = true
			out = append(out, &named[i])
		}
	}
	return out, nil
}

// claimMongo claims up to limit documents of t; see NewMongo.
func (s *Store) claimMongo(ctx context.Context, t *table, limit int, owner string) ([]outbox.Message, error) {
	fail := func(err error) ([]outbox.Message, error) {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return fail(err)
	}
	// Round robin: start after the group this Store claimed from last.
	s.mu.Lock()
	last := t.lastGroup
	s.mu.Unlock()
	groups, err := s.mongoGroups(ctx, t, last, min(mongoGroupWindow*limit, 20000))
	if err != nil {
		return fail(err)
	}
	token := owner + ":" + hex.EncodeToString([]byte(strconv.FormatInt(time.Now().UnixNano(), 36)))
	var out []outbox.Message
	var claimed []time.Time
	began := time.Now()
	for start := 0; start < len(groups) && len(out) < limit; start += mongoLockChunk {
		if len(out) > 0 && (time.Since(began) > mongoClaimBudget || callerGone(ctx)) {
			break // hand out what is leased; the next poll takes more
		}
		if callerGone(ctx) {
			return nil, context.Canceled // nothing leased yet
		}
		chunk := groups[start:min(start+mongoLockChunk, len(groups))]
		won, err := s.lockGroups(ctx, t, chunk, token, now)
		if err != nil {
			if len(out) > 0 {
				break
			}
			return fail(err)
		}
		for _, g := range won {
			if len(out) >= limit || (len(out) > 0 && (time.Since(began) > mongoClaimBudget || callerGone(ctx))) {
				break
			}
			msgs, err := s.claimGroup(ctx, t, g, min(limit-len(out), s.chunk), now, owner, began.Add(mongoClaimBudget))
			if err != nil {
				s.unlockGroups(context.WithoutCancel(ctx), t, won, token)
				if len(out) > 0 {
					s.log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
					s.remember(t, out, claimed)
					return out, nil
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
	if s.unorderedNull && len(out) < limit && !callerGone(ctx) {
		msgs, err := s.claimUnorderedMongo(ctx, t, limit-len(out), now, owner, began.Add(mongoClaimBudget))
		if err != nil && len(out) == 0 {
			return fail(err)
		}
		if err != nil {
			s.log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
		}
		for range msgs {
			claimed = append(claimed, now)
		}
		out = append(out, msgs...)
	}
	s.remember(t, out, claimed)
	return out, nil
}

// lockGroups takes the locks of the groups it can, taking over locks
// whose holder died (expired), and returns the groups it locked, in order.
func (s *Store) lockGroups(ctx context.Context, t *table, groups []*string, token string, now time.Time) ([]*string, error) {
	won, lost, err := s.insertLocks(ctx, t, groups, token, now)
	if err != nil || len(lost) == 0 {
		return won, err
	}
	ids := make(bson.A, len(lost))
	for i, g := range lost {
		ids[i] = lockID(t.raw, g)
	}
	res, err := s.mg.locks.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}},
		{Key: "expiresAt", Value: bson.D{{Key: "$lt", Value: now}}}})
	if err != nil || res.DeletedCount == 0 {
		return won, nil //nolint:nilerr // the groups held by others are skipped this time
	}
	more, _, err := s.insertLocks(ctx, t, lost, token, now)
	if err != nil {
		return won, nil //nolint:nilerr // as above
	}
	return append(won, more...), nil
}

// insertLocks inserts the lock documents of groups: won are the groups
// whose insert succeeded, lost those another claimer holds.
func (s *Store) insertLocks(ctx context.Context, t *table, groups []*string, token string, now time.Time) (won, lost []*string, err error) {
	docs := make([]any, len(groups))
	for i, g := range groups {
		docs[i] = bson.D{{Key: "_id", Value: lockID(t.raw, g)}, {Key: "owner", Value: token}, {Key: "expiresAt", Value: now.Add(mongoLockTTL)}}
	}
	_, err = s.mg.locks.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return groups, nil, nil
	}
	var bw mongo.BulkWriteException
	ok := errors.As(err, &bw) && bw.WriteConcernError == nil
	dup := map[int]bool{}
	for _, we := range bw.WriteErrors {
		ok = ok && we.HasErrorCode(11000)
		dup[we.Index] = true
	}
	if !ok {
		s.unlockGroups(context.WithoutCancel(ctx), t, groups, token)
		return nil, nil, fmt.Errorf("locks: %w", err)
	}
	for i, g := range groups {
		if dup[i] {
			lost = append(lost, g)
		} else {
			won = append(won, g)
		}
	}
	return won, lost, nil
}

func (s *Store) unlockGroups(ctx context.Context, t *table, groups []*string, token string) {
	if len(groups) == 0 {
		return
	}
	ids := make(bson.A, len(groups))
	for i, g := range groups {
		ids[i] = lockID(t.raw, g)
	}
	if _, err := s.mg.locks.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "owner", Value: token}}); err != nil {
		s.log.WarnContext(ctx, "seedstore: releasing claim locks failed; they expire", "collection", t.raw, "err", err, "ttl", mongoLockTTL)
	}
}

// claimGroup leases, under the group's lock, the run of due PENDING
// documents at the head of group g's unfinished documents, at most n:
// none while a document of g is PROCESSING. Filters are equalities on the
// seed's index fields (which FerretDB also pushes down to its backend).
func (s *Store) claimGroup(ctx context.Context, t *table, g *string, n int, now time.Time, owner string, deadline time.Time) ([]outbox.Message, error) {
	err := t.coll.FindOne(ctx, bson.D{{Key: "status", Value: StatusProcessing}, groupFilter(g)},
		options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
	if err == nil {
		return nil, nil // in flight
	}
	if !errors.Is(err, mongo.ErrNoDocuments) {
		return nil, err
	}
	rows, err := findRows(ctx, t.coll, bson.D{{Key: "status", Value: StatusPending}, groupFilter(g)},
		options.Find().SetSort(byOrder).SetLimit(int64(n)))
	if err != nil {
		return nil, err
	}
	var take []row
	for _, r := range rows {
		if r.processedAt.Valid && r.processedAt.Time.After(now) {
			break // waits for a retry, and so does the rest of the group
		}
		take = append(take, r)
	}
	if len(take) == 0 {
		return nil, nil
	}
	return s.leaseRows(ctx, t, take, groupFilter(g), now, owner, deadline)
}

// leaseRows marks rows (read PENDING under a lock) PROCESSING at now and
// returns those whose update applied. scope narrows the update (the
// group), so that FerretDB pushes its equality filters down.
func (s *Store) leaseRows(ctx context.Context, t *table, take []row, scope bson.E, now time.Time, owner string, deadline time.Time) ([]outbox.Message, error) {
	ids := make([]string, len(take))
	for i := range take {
		ids[i] = take[i].id
	}
	// Chunks grow from mongoFirstChunk: once the claim's time is up, it
	// stops after a chunk, leasing a prefix of the group (the rest waits
	// behind it), so a slow server sends the first rows early.
	var matched int64
	done, size := 0, mongoFirstChunk
	for done < len(ids) {
		if done > 0 && (time.Now().After(deadline) || callerGone(ctx)) {
			break
		}
		chunk := ids[done:min(done+size, len(ids))]
		res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusPending}, scope}, idFilter(chunk)...),
			bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusProcessing}, {Key: "processedAt", Value: now}}}})
		if err != nil {
			if done == 0 {
				return nil, err
			}
			s.log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
			break
		}
		matched += res.MatchedCount
		done += len(chunk)
		size = min(2*size, mongoChunk)
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
		r.status = StatusProcessing
		r.processedAt.Time, r.processedAt.Valid = now, true
		out[i] = s.message(&r, t.topic)
		out[i].ClaimedBy = owner
	}
	return out, nil
}

// claimUnorderedMongo claims null-group documents without FIFO
// (Options.UnorderedNullGroup), each under its own lock.
func (s *Store) claimUnorderedMongo(ctx context.Context, t *table, limit int, now time.Time, owner string, deadline time.Time) ([]outbox.Message, error) {
	rows, err := findRows(ctx, t.coll, bson.D{
		{Key: "status", Value: StatusPending}, {Key: "messageGroup", Value: nil},
		{Key: "$or", Value: bson.A{bson.D{{Key: "processedAt", Value: nil}}, bson.D{{Key: "processedAt", Value: bson.D{{Key: "$lte", Value: now}}}}}},
	}, options.Find().SetSort(byOrder).SetLimit(int64(limit)))
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	// Each document is locked as a group of its own ("id:" + _id).
	keys := make([]*string, len(rows))
	byKey := map[string]row{}
	for i, r := range rows {
		k := "id:" + r.id
		keys[i] = &k
		byKey[k] = r
	}
	token := owner + ":u"
	var take []row
	var locked []*string
	for start := 0; start < len(keys); start += mongoLockChunk {
		won, err := s.lockGroups(ctx, t, keys[start:min(start+mongoLockChunk, len(keys))], token, now)
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
		ids[i] = take[i].id
	}
	nullGroup := bson.E{Key: "messageGroup", Value: nil}
	fresh, err := findRows(ctx, t.coll, append(bson.D{{Key: "status", Value: StatusPending}, nullGroup}, idFilter(ids)...), options.Find().SetSort(byOrder))
	if err != nil || len(fresh) == 0 {
		return nil, err
	}
	return s.leaseRows(ctx, t, fresh, nullGroup, now, owner, deadline)
}

// finishMongo applies outcomes: per collection it reads the documents, keeps
// the outcomes whose document is still PROCESSING with the processedAt of
// this Store's claim, and writes them with updates fenced the same way. It
// returns the ids of the others.
func (s *Store) finishMongo(ctx context.Context, work map[*table]*perTable, now time.Time) ([]string, error) {
	var lost []string
	for _, t := range s.tables {
		w := work[t]
		if w == nil {
			continue
		}
		if err := s.finishTableMongo(ctx, t, w, now, &lost); err != nil {
			return nil, fmt.Errorf("seedstore: finish %s: %w", t.raw, err)
		}
	}
	return lost, nil
}

func (s *Store) finishTableMongo(ctx context.Context, t *table, w *perTable, now time.Time, lost *[]string) error {
	var all []string
	for _, b := range []*batch{&w.sent, &w.retry, &w.dead, &w.released} {
		all = append(all, b.ids...)
	}
	cur := map[string]row{}
	for start := 0; start < len(all); start += mongoChunk {
		// status first: an equality FerretDB pushes down.
		rows, err := findRows(ctx, t.coll, append(bson.D{{Key: "status", Value: StatusProcessing}}, idFilter(all[start:min(start+mongoChunk, len(all))])...),
			options.Find().SetProjection(bson.D{{Key: "status", Value: 1}, {Key: "processedAt", Value: 1}}))
		if err != nil {
			return err
		}
		for _, r := range rows {
			cur[r.id] = r
		}
	}
	// Outcomes with the same claim time and the same values are written
	// by one fenced updateMany.
	type key struct {
		claimed time.Time
		set     string
	}
	type change struct {
		ids []string
		set bson.D
	}
	var order []key
	changes := map[key]*change{}
	add := func(b *batch, i int, set bson.D) {
		id := b.ids[i]
		c, ok := cur[id]
		if !ok || c.status != StatusProcessing || !c.processedAt.Valid || !c.processedAt.Time.Equal(b.claimed[i].UTC().Truncate(time.Millisecond)) {
			*lost = append(*lost, id)
			return
		}
		k := key{claimed: c.processedAt.Time, set: fmt.Sprint(set)}
		if changes[k] == nil {
			order = append(order, k)
			changes[k] = &change{set: set}
		}
		changes[k].ids = append(changes[k].ids, id)
	}
	after := func(us int64) time.Time {
		return now.Add(time.Duration(us) * time.Microsecond).Truncate(time.Millisecond)
	}
	for i := range w.sent.ids {
		add(&w.sent, i, bson.D{{Key: "status", Value: StatusCompleted}, {Key: "processedAt", Value: now}, {Key: "errorMessage", Value: nil}})
	}
	for i := range w.retry.ids {
		add(&w.retry, i, bson.D{{Key: "status", Value: StatusPending}, {Key: "processedAt", Value: after(w.retry.next[i])},
			{Key: "retryCount", Value: w.retry.retry[i]}, {Key: "errorMessage", Value: w.retry.msgs[i]}})
	}
	for i := range w.dead.ids {
		add(&w.dead, i, bson.D{{Key: "status", Value: StatusFailed}, {Key: "processedAt", Value: now}, {Key: "errorMessage", Value: w.dead.msgs[i]}})
	}
	for i := range w.released.ids {
		var next any // nil: due at once
		if d := w.released.deferTo[i]; d != nil {
			next = after(*d)
		}
		add(&w.released, i, bson.D{{Key: "status", Value: StatusPending}, {Key: "processedAt", Value: next}})
	}
	for _, k := range order {
		c := changes[k]
		for start := 0; start < len(c.ids); start += mongoChunk {
			ids := c.ids[start:min(start+mongoChunk, len(c.ids))]
			res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusProcessing},
				{Key: "processedAt", Value: k.claimed}}, idFilter(ids)...), bson.D{{Key: "$set", Value: c.set}})
			if err != nil {
				return err
			}
			if int(res.MatchedCount) != len(ids) {
				// A recovery moved some between the read and the write:
				// those are PENDING again and will be sent again.
				s.log.WarnContext(ctx, "seedstore: some outcomes lost their lease while being written",
					"collection", t.raw, "outcomes", len(ids), "applied", res.MatchedCount)
			}
		}
	}
	return nil
}

// recoverMongo puts t's stuck PROCESSING documents back to PENDING (or,
// with Options.RecoveryCountsAttempt, counts the lost attempt and fails
// the documents that used their last one).
func (s *Store) recoverMongo(ctx context.Context, t *table, timeout time.Duration, maxAttempts int) (recovered, dead int, err error) {
	now, err := s.serverNow(ctx)
	if err != nil {
		return 0, 0, err
	}
	stuck := bson.D{{Key: "status", Value: StatusProcessing}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "processedAt", Value: nil}},
		bson.D{{Key: "processedAt", Value: bson.D{{Key: "$lt", Value: now.Add(-timeout)}}}},
	}}}
	if s.recoveryCounts {
		msg := errorText(outbox.ErrorInfo{Code: "lease_expired", Message: "the processor did not finish the attempt in time"})
		res, err := t.coll.UpdateMany(ctx, append(stuck, bson.E{Key: "retryCount", Value: bson.D{{Key: "$gte", Value: maxAttempts - 1}}}),
			bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusFailed}, {Key: "processedAt", Value: now}, {Key: "errorMessage", Value: msg}}}})
		if err != nil {
			return 0, 0, err
		}
		dead = int(res.ModifiedCount)
		res, err = t.coll.UpdateMany(ctx, stuck, bson.D{
			{Key: "$set", Value: bson.D{{Key: "status", Value: StatusPending}, {Key: "processedAt", Value: nil}}},
			{Key: "$inc", Value: bson.D{{Key: "retryCount", Value: 1}}},
		})
		if err != nil {
			return 0, dead, err
		}
		return int(res.ModifiedCount), dead, nil
	}
	res, err := t.coll.UpdateMany(ctx, stuck, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusPending}, {Key: "processedAt", Value: nil}}}})
	if err != nil {
		return 0, 0, err
	}
	return int(res.ModifiedCount), 0, nil
}

// InsertMongo writes items as PENDING documents of a MongoDB Store (see
// NewMongo), in the session ctx carries if any (inside
// Session.WithTransaction they commit with the caller's writes; without a
// transaction each document is written at once). It returns the ids in
// order; items are validated as by Insert before anything is written.
func (s *Store) InsertMongo(ctx context.Context, items ...Item) ([]string, error) {
	if s.mg == nil {
		return nil, errors.New("seedstore: InsertMongo needs a Store from NewMongo")
	}
	rows, err := s.prepareItems(items)
	if err != nil {
		return nil, err
	}
	// One insertMany per collection and chunk, in order: a failure (say a
	// duplicate _id) stops at that document.
	ids := make([]string, len(rows))
	docs := map[*table][]any{}
	var order []*table
	for i, it := range rows {
		t := s.tableOf(it.Topic)
		var group any
		if it.Group != "" {
			group = it.Group
		}
		var due any
		if !it.DueAt.IsZero() {
			due = it.DueAt.UTC().Truncate(time.Millisecond)
		}
		if docs[t] == nil {
			order = append(order, t)
		}
		docs[t] = append(docs[t], bson.D{
			{Key: "_id", Value: it.ID}, {Key: "type", Value: it.Topic}, {Key: "messageGroup", Value: group},
			{Key: "payload", Value: string(it.Payload)}, {Key: "status", Value: StatusPending}, {Key: "retryCount", Value: 0},
			{Key: "createdAt", Value: it.CreatedAt.UTC().Truncate(time.Millisecond)}, {Key: "processedAt", Value: due},
			{Key: "errorMessage", Value: nil},
		})
		ids[i] = it.ID
	}
	for _, t := range order {
		d := docs[t]
		for start := 0; start < len(d); start += mongoChunk {
			if _, err := t.coll.InsertMany(ctx, d[start:min(start+mongoChunk, len(d))]); err != nil {
				return nil, fmt.Errorf("seedstore: insert into %s: %w", t.raw, err)
			}
		}
	}
	return ids, nil
}

// getMongo returns the document with id from t, or false.
func (s *Store) getMongo(ctx context.Context, t *table, id string) (row, bool, error) {
	rows, err := findRows(ctx, t.coll, idFilter([]string{id}), options.Find().SetLimit(1))
	if err != nil || len(rows) == 0 {
		return row{}, false, err
	}
	return rows[0], true, nil
}

// listMongo returns up to limit documents of t ordered by _id, after the id
// after, with status and group when set.
func (s *Store) listMongo(ctx context.Context, t *table, after, status, group string, limit int) ([]row, error) {
	f := bson.D{}
	if after != "" {
		f = append(f, bson.E{Key: "_id", Value: bson.D{{Key: "$gt", Value: after}}})
	}
	if status != "" {
		f = append(f, bson.E{Key: "status", Value: status})
	}
	if group != "" {
		f = append(f, bson.E{Key: "messageGroup", Value: group})
	}
	return findRows(ctx, t.coll, f, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit)))
}

// countMongo counts t's documents by status.
func (s *Store) countMongo(ctx context.Context, t *table) (map[string]int64, error) {
	out := map[string]int64{}
	for _, st := range []string{StatusPending, StatusProcessing, StatusCompleted, StatusFailed} {
		n, err := t.coll.CountDocuments(ctx, bson.D{{Key: "status", Value: st}})
		if err != nil {
			return nil, err
		}
		out[st] = n
	}
	return out, nil
}

// requeueMongo moves t's FAILED document id back to PENDING.
func (s *Store) requeueMongo(ctx context.Context, t *table, id string) (bool, error) {
	res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusFailed}}, idFilter([]string{id})...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusPending}, {Key: "retryCount", Value: 0},
			{Key: "processedAt", Value: nil}, {Key: "errorMessage", Value: nil}}}})
	if err != nil {
		return false, err
	}
	return res.MatchedCount > 0, nil
}

// pruneMongo deletes up to limit of t's COMPLETED and FAILED documents
// finished before before.
func (s *Store) pruneMongo(ctx context.Context, t *table, before time.Time, limit int) (int, error) {
	rows, err := findRows(ctx, t.coll, bson.D{
		{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusCompleted, StatusFailed}}}},
		{Key: "processedAt", Value: bson.D{{Key: "$lt", Value: before}}},
	}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetSort(bson.D{{Key: "processedAt", Value: 1}}).SetLimit(int64(limit)))
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].id
	}
	total := 0
	for start := 0; start < len(ids); start += mongoChunk {
		res, err := t.coll.DeleteMany(ctx, append(idFilter(ids[start:min(start+mongoChunk, len(ids))]),
			bson.E{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusCompleted, StatusFailed}}}}))
		if err != nil {
			return total, err
		}
		total += int(res.DeletedCount)
	}
	return total, nil
}
