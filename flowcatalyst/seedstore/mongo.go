package seedstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
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

// mongoClaimBudget is how long a claim goes on taking further documents
// once it has leased some (at least as long as it took to find the
// groups): on a slow server (FerretDB scans the collection for
// every command and writes each document of an update on its own) the
// first rows are handed out, and sent, while the next claim (at once,
// through Wakeups) takes the rest.
const mongoClaimBudget = 250 * time.Millisecond

// mongoFirstChunk is the first update of a Store's first claim: small, so
// that the first documents on a fresh collection are sent as soon as they
// are leased, however slow the server.
const mongoFirstChunk = 8

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

// mongoLockChunk is the first batch of lock documents a claim inserts;
// later batches double up to mongoMaxLockChunk.
const mongoLockChunk = 8

// mongoMaxLockChunk bounds the lock documents one insert carries.
const mongoMaxLockChunk = 64

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
//     concurrent inserts exactly one succeeds); under the lock one read
//     returns the group's unfinished documents, PROCESSING first, then in
//     (createdAt, _id) order, and one updateMany (fenced by status PENDING)
//     leases the run of due PENDING documents from the head (none while a
//     document is PROCESSING or the head waits for a retry), then the lock
//     is deleted. Locks are inserted and deleted a batch of groups at a
//     time. A lock left by a processor that died expires after 30 s;
//   - groups are visited in turn (round robin by name), not oldest first:
//     the claim reads the groups of a bounded window of PENDING and
//     PROCESSING documents through the seed's index instead of sorting
//     every PENDING document;
//   - a claim hands out what it leased once it has worked for 250 ms
//     after its first lease, and a Store's first claim after its first 8
//     documents, so a slow server sends early; Wakeups then brings the
//     next claim at once;
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
	s.mg = &mongoDB{db: db, locks: db.Collection(opts.LocksCollection), budget: mongoClaimBudget}
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
	db     *mongo.Database
	locks  *mongo.Collection
	budget time.Duration // mongoClaimBudget; tests change it
	// claimed is set once a claim leased something: the first claim
	// hands out its first documents at once (claimPace).
	claimed atomic.Bool
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

// mongoGroupWindow bounds the PENDING and PROCESSING documents one claim
// reads to find groups: per limit item, at most this many index entries.
const mongoGroupWindow = 4

// mongoGroups returns groups of t with PENDING documents and none
// PROCESSING seen, in turn: the null group first (if it has any), then the
// named groups after last by name, wrapping around. It reads at most window
// PENDING and PROCESSING documents' group and status, in the order of the
// seed's index within each status (groups, then createdAt), so its cost
// does not grow with the backlog; a group with a PROCESSING document among
// them is in flight and left out (claimGroup checks again under the lock).
//
// While the unfinished documents fit in the window (fit: the last claim saw
// them all), and on the first turn (last nil), that is one read from the
// start (null first), rotated here. Otherwise it reads the named groups
// after last (and, at the end, from the start again) and asks whether the
// null group has any.
func (s *Store) mongoGroups(ctx context.Context, t *table, last *string, fit bool, window int) ([]*string, error) {
	busy := map[string]bool{}
	null, nullBusy := false, false
	// scan reads up to window entries with messageGroup matching bound
	// (nil: any, null included) and reports whether it saw them all.
	scan := func(bound any) ([]string, bool, error) {
		filter := bson.D{{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusPending, StatusProcessing}}}}}
		if bound != nil {
			filter = append(filter, bson.E{Key: "messageGroup", Value: bound})
		}
		cur, err := t.coll.Find(ctx, filter,
			options.Find().SetSort(bson.D{{Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}}).
				SetProjection(bson.D{{Key: "_id", Value: 0}, {Key: "messageGroup", Value: 1}, {Key: "status", Value: 1}}).
				SetLimit(int64(window)).SetBatchSize(int32(min(window, 10000))))
		if err != nil {
			return nil, false, err
		}
		defer cur.Close(ctx)
		var out []string
		n := 0
		for cur.Next(ctx) {
			n++
			inFlight := false
			if st, _ := cur.Current.Lookup("status").StringValueOK(); st == StatusProcessing {
				inFlight = true
			}
			g, ok := cur.Current.Lookup("messageGroup").StringValueOK()
			if !ok {
				null = null || !inFlight
				nullBusy = nullBusy || inFlight
				continue
			}
			busy[g] = busy[g] || inFlight
			if len(out) == 0 || out[len(out)-1] != g {
				out = append(out, g)
			}
		}
		return out, n < window, cur.Err()
	}
	var named []string
	fits, done, nullKnown := false, false, false
	if last == nil || fit {
		all, complete, err := scan(nil)
		if err != nil {
			return nil, err
		}
		// The null group sorts first: this read saw it if it has any.
		nullKnown = true
		switch {
		case complete:
			fits, done = true, true
			// Rotate: the groups after last, then the rest.
			from := 0
			if last != nil {
				from = sort.SearchStrings(all, *last)
				if from < len(all) && all[from] == *last {
					from++
				}
			}
			named = append(all[from:len(all):len(all)], all[:from]...)
		case last == nil && len(all) > 0:
			// The first turn: the groups from the start.
			named, done = all, true
		}
	}
	if !done {
		clear(busy)
		// Every string is $gte "": the first turn starts at the empty group.
		var bound bson.D
		if last == nil {
			bound = bson.D{{Key: "$gte", Value: ""}}
		} else {
			bound = bson.D{{Key: "$gt", Value: *last}}
		}
		var complete bool
		var err error
		if named, complete, err = scan(bound); err != nil {
			return nil, err
		}
		if last != nil && complete {
			// Wrap around.
			more, _, err := scan(bson.D{{Key: "$lte", Value: *last}})
			if err != nil {
				return nil, err
			}
			named = append(named, more...)
		}
		// The sort puts null first, but the string bound leaves it out:
		// ask. A null group in flight is found under the lock.
		if !s.unorderedNull && !nullKnown {
			err := t.coll.FindOne(ctx, bson.D{{Key: "status", Value: StatusPending}, {Key: "messageGroup", Value: nil}},
				options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
			switch {
			case err == nil:
				null = true
			case !errors.Is(err, mongo.ErrNoDocuments):
				return nil, err
			}
		}
	}
	s.mu.Lock()
	t.groupsFit = fits
	s.mu.Unlock()
	var out []*string
	if !s.unorderedNull && null && !nullBusy {
		out = append(out, nil)
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

// claimMongo claims up to limit documents of t at now (the server's
// clock, read once per MessageClaim); see NewMongo. It reports whether it
// stopped early (claimPace) with groups left to try: the processor is then
// woken to claim again at once.
func (s *Store) claimMongo(ctx context.Context, t *table, limit int, owner string, now time.Time) ([]outbox.Message, bool, error) {
	fail := func(err error) ([]outbox.Message, bool, error) {
		return nil, false, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	// Round robin: start after the group this Store claimed from last.
	s.mu.Lock()
	last, fit := t.lastGroup, t.groupsFit
	s.mu.Unlock()
	began := time.Now()
	groups, err := s.mongoGroups(ctx, t, last, fit, min(mongoGroupWindow*limit, 20000))
	if err != nil {
		return fail(err)
	}
	// The budget is at least what finding the groups took, so that on a
	// slow server the claim's fixed part stays at most half of it.
	budget := max(s.mg.budget, time.Since(began))
	token := owner + ":" + hex.EncodeToString([]byte(strconv.FormatInt(time.Now().UnixNano(), 36)))
	var out []outbox.Message
	var claimed []time.Time
	pace := &claimPace{first: !s.mg.claimed.Load(), budget: budget}
	cut := false
	// Locks are taken a batch of groups at a time, the batches growing
	// from mongoLockChunk: a claim that needs few groups locks few, one
	// that needs many makes few round trips.
	size := mongoLockChunk
	for start := 0; start < len(groups) && len(out) < limit; {
		if len(out) > 0 && (pace.enough() || callerGone(ctx)) {
			cut = !callerGone(ctx)
			break // hand out what is leased; the next claim takes more
		}
		if callerGone(ctx) {
			return nil, false, context.Canceled // nothing leased yet
		}
		chunk := groups[start:min(start+size, len(groups))]
		start += len(chunk)
		size = min(2*size, mongoMaxLockChunk)
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
			if len(out) > 0 && (pace.enough() || callerGone(ctx)) {
				cut = !callerGone(ctx) // this group and the rest untried
				start = len(groups)
				break
			}
			msgs, err := s.claimGroup(ctx, t, g, min(limit-len(out), s.chunk), now, owner, pace)
			if err != nil {
				s.unlockGroups(context.WithoutCancel(ctx), t, won, token)
				if len(out) > 0 {
					s.log.WarnContext(ctx, "seedstore: claim failed", "collection", t.raw, "err", err)
					s.remember(t, out, claimed)
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
	if s.unorderedNull && len(out) < limit && !callerGone(ctx) {
		msgs, err := s.claimUnorderedMongo(ctx, t, limit-len(out), now, owner, pace)
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
	return out, cut && len(out) < limit, nil
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
	var take []row
	for _, r := range rows {
		if r.status != StatusPending {
			break // in flight
		}
		if r.processedAt.Valid && r.processedAt.Time.After(now) {
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
func (s *Store) leaseRows(ctx context.Context, t *table, take []row, scope bson.E, now time.Time, owner string, pace *claimPace) ([]outbox.Message, error) {
	ids := make([]string, len(take))
	for i := range take {
		ids[i] = take[i].id
	}
	// One update per mongoChunk documents (a Store's first claim starts
	// with mongoFirstChunk): once the claim has leased enough, it stops
	// after a chunk, leasing a prefix of the group (the rest waits behind
	// it).
	var matched int64
	done := 0
	for done < len(ids) {
		if done > 0 && (pace.enough() || callerGone(ctx)) {
			break
		}
		size := mongoChunk
		if done == 0 && pace.first {
			size = mongoFirstChunk
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
		r.status = StatusProcessing
		r.processedAt.Time, r.processedAt.Valid = now, true
		out[i] = s.message(&r, t.topic)
		out[i].ClaimedBy = owner
	}
	return out, nil
}

// claimUnorderedMongo claims null-group documents without FIFO
// (Options.UnorderedNullGroup), each under its own lock.
func (s *Store) claimUnorderedMongo(ctx context.Context, t *table, limit int, now time.Time, owner string, pace *claimPace) ([]outbox.Message, error) {
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
	return s.leaseRows(ctx, t, fresh, nullGroup, now, owner, pace)
}

// finishMongo applies outcomes: per collection, one updateMany per
// (claim time, values) and mongoChunk documents, fenced by the lease (the
// document is PROCESSING with the processedAt this Store's claim wrote).
// It returns the ids of the outcomes that did not apply.
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

// mongoState is what an outcome writes: the status and processedAt (nil:
// null) a document holds once it applied.
type mongoState struct {
	status string
	at     any
}

func (s *Store) finishTableMongo(ctx context.Context, t *table, w *perTable, now time.Time, lost *[]string) error {
	type key struct {
		claimed time.Time
		set     string
	}
	type change struct {
		claimed time.Time
		ids     []string
		set     bson.D
	}
	var order []key
	changes := map[key]*change{}
	want := map[string]mongoState{}
	add := func(b *batch, i int, status string, at any, more ...bson.E) {
		set := append(bson.D{{Key: "status", Value: status}, {Key: "processedAt", Value: at}}, more...)
		k := key{claimed: b.claimed[i].UTC().Truncate(time.Millisecond), set: fmt.Sprint(set)}
		if changes[k] == nil {
			order = append(order, k)
			changes[k] = &change{claimed: k.claimed, set: set}
		}
		changes[k].ids = append(changes[k].ids, b.ids[i])
		want[b.ids[i]] = mongoState{status: status, at: at}
	}
	after := func(us int64) time.Time {
		return now.Add(time.Duration(us) * time.Microsecond).Truncate(time.Millisecond)
	}
	for i := range w.sent.ids {
		add(&w.sent, i, StatusCompleted, now, bson.E{Key: "errorMessage", Value: nil})
	}
	for i := range w.retry.ids {
		add(&w.retry, i, StatusPending, after(w.retry.next[i]),
			bson.E{Key: "retryCount", Value: w.retry.retry[i]}, bson.E{Key: "errorMessage", Value: w.retry.msgs[i]})
	}
	for i := range w.dead.ids {
		add(&w.dead, i, StatusFailed, now, bson.E{Key: "errorMessage", Value: w.dead.msgs[i]})
	}
	for i := range w.released.ids {
		var next any // nil: due at once
		if d := w.released.deferTo[i]; d != nil {
			next = after(*d)
		}
		add(&w.released, i, StatusPending, next)
	}
	// One updateMany per change and mongoChunk ids, one after the other:
	// FerretDB v1 holds a PostgreSQL connection per statement of a bulk
	// write until the command ends, and concurrent bulk writes deadlock its
	// pool.
	for _, k := range order {
		c := changes[k]
		for start := 0; start < len(c.ids); start += mongoChunk {
			ids := c.ids[start:min(start+mongoChunk, len(c.ids))]
			res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusProcessing},
				{Key: "processedAt", Value: c.claimed}}, idFilter(ids)...), bson.D{{Key: "$set", Value: c.set}})
			if err != nil {
				return err
			}
			if int(res.MatchedCount) != len(ids) {
				// Some leases were lost (recovered, maybe claimed again):
				// the documents that do not hold what their outcome wrote
				// (its status and processedAt, to the millisecond of this
				// finish's server time) are the ones it did not apply to.
				applied, err := s.holding(ctx, t, ids, want)
				if err != nil {
					return err
				}
				for _, id := range ids {
					if !applied[id] {
						*lost = append(*lost, id)
					}
				}
			}
		}
	}
	return nil
}

// holding returns which of ids hold the state want names for them.
func (s *Store) holding(ctx context.Context, t *table, ids []string, want map[string]mongoState) (map[string]bool, error) {
	rows, err := findRows(ctx, t.coll, idFilter(ids),
		options.Find().SetProjection(bson.D{{Key: "status", Value: 1}, {Key: "processedAt", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range rows {
		w, ok := want[r.id]
		if !ok || r.status != w.status {
			continue
		}
		switch at := w.at.(type) {
		case time.Time:
			out[r.id] = r.processedAt.Valid && r.processedAt.Time.Equal(at)
		default: // null
			out[r.id] = !r.processedAt.Valid
		}
	}
	return out, nil
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
