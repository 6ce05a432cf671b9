package mongo

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/outbox"
)

// writeTimeout bounds a write that goes on after its caller's ctx ended.
const writeTimeout = 30 * time.Second

// filterDoc is the query that selects f's messages.
func filterDoc(f outbox.MessageFilter) bson.D {
	var d bson.D
	if len(f.Tenants) > 0 {
		d = append(d, bson.E{Key: "tenant", Value: bson.D{{Key: "$in", Value: f.Tenants}}})
	}
	if f.Status != "" {
		d = append(d, bson.E{Key: "status", Value: string(f.Status)})
	}
	if f.Topic != "" {
		d = append(d, bson.E{Key: "topic", Value: f.Topic})
	}
	if f.Group != "" {
		d = append(d, bson.E{Key: "grp", Value: f.Group})
	}
	if f.ErrorCode != "" {
		d = append(d, bson.E{Key: "last_error.code", Value: f.ErrorCode})
	}
	var created bson.D
	if !f.CreatedAfter.IsZero() {
		created = append(created, bson.E{Key: "$gte", Value: f.CreatedAfter.UTC()})
	}
	if !f.CreatedBefore.IsZero() {
		created = append(created, bson.E{Key: "$lt", Value: f.CreatedBefore.UTC()})
	}
	if len(created) > 0 {
		d = append(d, bson.E{Key: "created_at", Value: created})
	}
	if f.BlocksGroup {
		d = append(d, bson.E{Key: "blocks_group", Value: true}) // set on FAILED messages only
	}
	return d
}

// MessageSearch implements outbox.Admin: messages of every tenant matching
// p.Filter, in Seq order, a page at a time.
func (s *Store) MessageSearch(ctx context.Context, p outbox.MessageSearchParams) (outbox.MessagePage, error) {
	if err := p.Prepare(); err != nil {
		return outbox.MessagePage{}, err
	}
	f := append(filterDoc(p.Filter), bson.E{Key: "seq", Value: bson.D{{Key: "$gt", Value: p.AfterSeq}}})
	var docs []msgDoc
	if err := s.findAll(ctx, f, &docs, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).SetLimit(int64(p.Limit)+1)); err != nil {
		return outbox.MessagePage{}, fmt.Errorf("mongo: search: %w", err)
	}
	var page outbox.MessagePage
	if len(docs) > p.Limit {
		docs = docs[:p.Limit]
		page.NextAfterSeq = docs[p.Limit-1].Seq
	}
	page.Messages = make([]outbox.Message, len(docs))
	for i := range docs {
		page.Messages[i] = docs[i].message()
	}
	return page, nil
}

// MessageRequeueMany implements outbox.Admin: up to p.Limit FAILED messages
// matching p.Filter after p.AfterSeq go back to PENDING (due p.Now,
// attempts reset, history kept).
//
// A call is not one transaction on MongoDB: it reads the chunk's IDs, then
// moves them with one updateMany fenced by status FAILED, and each message
// moves atomically. A call interrupted part way leaves some of its chunk
// requeued; repeating it with the same AfterSeq requeues the rest (the
// requeued ones are no longer FAILED and are skipped). Requeued counts the
// messages the update moved: one requeued meanwhile by someone else is
// matched but not counted.
func (s *Store) MessageRequeueMany(ctx context.Context, p outbox.MessageRequeueManyParams) (outbox.RequeueManyResult, error) {
	if p.Now.IsZero() {
		p.Now = s.now(s.clock.Now())
	}
	if err := p.Prepare(); err != nil {
		return outbox.RequeueManyResult{}, err
	}
	now := s.now(p.Now)
	f := append(filterDoc(p.Filter), bson.E{Key: "seq", Value: bson.D{{Key: "$gt", Value: p.AfterSeq}}})
	var docs []struct {
		ID  string `bson:"_id"`
		Seq int64  `bson:"seq"`
	}
	if err := s.findAll(ctx, f, &docs, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).
		SetLimit(int64(p.Limit)+1).SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "seq", Value: 1}})); err != nil {
		return outbox.RequeueManyResult{}, fmt.Errorf("mongo: requeue many: %w", err)
	}
	var res outbox.RequeueManyResult
	if len(docs) > p.Limit {
		docs = docs[:p.Limit]
		res.NextAfterSeq = docs[p.Limit-1].Seq
	}
	res.Matched = len(docs)
	ids := make(bson.A, len(docs))
	for i, d := range docs {
		res.IDs = append(res.IDs, d.ID)
		ids[i] = d.ID
	}
	if p.DryRun || len(docs) == 0 {
		return res, nil
	}
	// From here on the chunk is being changed: finish it even if ctx ends,
	// so that the result says what happened.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	r, err := s.msgs.UpdateMany(wctx,
		bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "status", Value: string(outbox.StatusFailed)}},
		requeueUpdate(now))
	if err != nil {
		return outbox.RequeueManyResult{}, fmt.Errorf("mongo: requeue many: %w", err)
	}
	res.Requeued = int(r.ModifiedCount)
	if res.Requeued > 0 {
		s.Notify()
	}
	return res, nil
}

// TopicStats implements outbox.Admin. The counts are one aggregation that
// reads every message of the selected tenants (an operator's query, not one
// for a hot path); the oldest PENDING message of each topic that has one is
// then one index lookup (status_topic_created). Aggregation's $min would do
// it in the same pass, but FerretDB does not implement it.
func (s *Store) TopicStats(ctx context.Context, p outbox.TopicStatsParams) ([]outbox.TopicStat, error) {
	tf := outbox.MessageFilter{Tenants: p.Tenants}
	if err := tf.Validate(); err != nil {
		return nil, err
	}
	match := filterDoc(tf)
	var pipe mongo.Pipeline
	if len(match) > 0 {
		pipe = append(pipe, bson.D{{Key: "$match", Value: match}})
	}
	pipe = append(pipe, bson.D{{Key: "$group", Value: bson.D{
		{Key: "_id", Value: bson.D{{Key: "topic", Value: "$topic"}, {Key: "status", Value: "$status"}}},
		{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
	}}})
	cur, err := s.msgs.Aggregate(ctx, pipe)
	if err != nil {
		return nil, fmt.Errorf("mongo: topic stats: %w", err)
	}
	var rows []struct {
		ID struct {
			Topic  string `bson:"topic"`
			Status string `bson:"status"`
		} `bson:"_id"`
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, fmt.Errorf("mongo: topic stats: %w", err)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID.Topic < rows[j].ID.Topic })
	var out []outbox.TopicStat
	for _, r := range rows {
		out = adminsql.AddStat(out, r.ID.Topic, outbox.Status(r.ID.Status), r.N, time.Time{})
	}
	for i := range out {
		st := &out[i]
		if st.Counts[outbox.StatusPending] > 0 {
			var d struct {
				CreatedAt bson.DateTime `bson:"created_at"`
			}
			f := append(bson.D{{Key: "status", Value: string(outbox.StatusPending)}, {Key: "topic", Value: st.Topic}}, match...)
			err := s.msgs.FindOne(ctx, f, options.FindOne().SetSort(bson.D{{Key: "created_at", Value: 1}}).
				SetProjection(bson.D{{Key: "created_at", Value: 1}})).Decode(&d)
			switch {
			case errors.Is(err, mongo.ErrNoDocuments): // sent meanwhile
			case err != nil:
				return nil, fmt.Errorf("mongo: topic stats: oldest pending of %q: %w", st.Topic, err)
			default:
				st.OldestPendingAt = d.CreatedAt.Time().UTC()
			}
		}
	}
	return out, nil
}

// pauseDoc is one pause; its _id (lenKey of topic, group, tenant) makes it
// unique.
type pauseDoc struct {
	ID        string    `bson:"_id"`
	Topic     string    `bson:"topic"`
	Group     string    `bson:"grp"`
	Tenant    string    `bson:"tenant"`
	CreatedAt time.Time `bson:"created_at"`
}

// maxPauses bounds the pauses a claim reads.
const maxPauses = 10000

// notPaused returns the condition that keeps a claim off paused messages
// (nil when nothing is paused). A claim reads the pauses collection first:
// one small query, so a pause applies to the next claim of every process.
func (s *Store) notPaused(ctx context.Context) (bson.D, error) {
	cur, err := s.pauses.Find(ctx, bson.D{}, options.Find().SetLimit(maxPauses).SetBatchSize(maxPauses))
	if err != nil {
		return nil, fmt.Errorf("pauses: %w", err)
	}
	var ps []pauseDoc
	if err := cur.All(ctx, &ps); err != nil {
		return nil, fmt.Errorf("pauses: %w", err)
	}
	if len(ps) == 0 {
		return nil, nil
	}
	nor := make(bson.A, len(ps))
	for i, p := range ps {
		c := bson.D{{Key: "topic", Value: p.Topic}}
		if p.Group != "" {
			c = append(c, bson.E{Key: "grp", Value: p.Group})
		}
		if p.Tenant != "" {
			c = append(c, bson.E{Key: "tenant", Value: p.Tenant})
		}
		nor[i] = c
	}
	return bson.D{{Key: "$nor", Value: nor}}, nil
}

// PauseAdd implements outbox.Admin: claims that start after it returns
// skip the PENDING messages of p.Topic (of p.Group, of p.Tenant when set).
func (s *Store) PauseAdd(ctx context.Context, p outbox.PauseAddParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	_, err := s.pauses.InsertOne(ctx, pauseDoc{ID: lenKey(p.Topic, p.Group, p.Tenant), Topic: p.Topic, Group: p.Group,
		Tenant: p.Tenant, CreatedAt: s.now(p.Now)})
	if err != nil && !mongo.IsDuplicateKeyError(err) {
		return fmt.Errorf("mongo: pause: %w", err)
	}
	return nil
}

// PauseRemove implements outbox.Admin and wakes this process's processors
// when a pause was removed.
func (s *Store) PauseRemove(ctx context.Context, p outbox.PauseRemoveParams) (bool, error) {
	if err := p.Validate(); err != nil {
		return false, err
	}
	r, err := s.pauses.DeleteOne(ctx, bson.D{{Key: "_id", Value: lenKey(p.Topic, p.Group, p.Tenant)}})
	if err != nil {
		return false, fmt.Errorf("mongo: resume: %w", err)
	}
	if r.DeletedCount > 0 {
		s.Notify()
	}
	return r.DeletedCount > 0, nil
}

// PauseList implements outbox.Admin.
func (s *Store) PauseList(ctx context.Context, _ outbox.PauseListParams) ([]outbox.Pause, error) {
	cur, err := s.pauses.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "topic", Value: 1}, {Key: "grp", Value: 1}, {Key: "tenant", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("mongo: pauses: %w", err)
	}
	var ps []pauseDoc
	if err := cur.All(ctx, &ps); err != nil {
		return nil, fmt.Errorf("mongo: pauses: %w", err)
	}
	out := make([]outbox.Pause, len(ps))
	for i, p := range ps {
		out[i] = outbox.Pause{Topic: p.Topic, Group: p.Group, Tenant: p.Tenant, CreatedAt: p.CreatedAt.UTC()}
	}
	return out, nil
}
