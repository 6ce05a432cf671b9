package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet implements outbox.Store: the message with p.ID in p.Tenant, or
// an error wrapping outbox.ErrNotFound.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	d, err := s.get(ctx, p.Tenant, p.ID)
	if err != nil {
		return outbox.Message{}, err
	}
	return d.message(), nil
}

func (s *Store) get(ctx context.Context, tenant, id string) (msgDoc, error) {
	var d msgDoc
	err := s.msgs.FindOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "tenant", Value: tenant}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return d, notFound(tenant, id)
	}
	if err != nil {
		return d, fmt.Errorf("mongo: get %s: %w", id, err)
	}
	return d, nil
}

// MessageList implements outbox.Store: a page of p.Tenant's messages in Seq
// order, optionally filtered by status, topic and group.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	return s.list(ctx, p)
}

// MessageListTx is MessageList in the caller's session: in a transaction it
// sees the transaction's own uncommitted messages. tx is the context that
// carries the session, as for MessageEnqueueTx.
func (s *Store) MessageListTx(ctx context.Context, tx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if tx == nil {
		return outbox.MessagePage{}, outbox.InvalidParam("tx", "is nil")
	}
	sess := mongo.SessionFromContext(tx)
	if sess == nil {
		return outbox.MessagePage{}, outbox.InvalidParam("tx", "carries no session")
	}
	return s.list(mongo.NewSessionContext(ctx, sess), p)
}

func (s *Store) list(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if err := p.Validate(); err != nil {
		return outbox.MessagePage{}, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	f := append(bson.D{{Key: "tenant", Value: p.Tenant}, {Key: "seq", Value: bson.D{{Key: "$gt", Value: p.AfterSeq}}}},
		filterDoc(outbox.MessageFilter{Status: p.Status, Topic: p.Topic, Group: p.Group, BlocksGroup: p.BlocksGroup})...)
	var docs []msgDoc
	if err := s.findAll(ctx, f, &docs, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).SetLimit(int64(limit)+1)); err != nil {
		return outbox.MessagePage{}, fmt.Errorf("mongo: list: %w", err)
	}
	var page outbox.MessagePage
	if len(docs) > limit {
		docs = docs[:limit]
		page.NextAfterSeq = docs[limit-1].Seq
	}
	page.Messages = make([]outbox.Message, len(docs))
	for i := range docs {
		page.Messages[i] = docs[i].message()
	}
	return page, nil
}

// MessageCount implements outbox.Store: p.Tenant's messages (all tenants'
// with p.AllTenants) counted by status; every status is present.
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	var pipe mongo.Pipeline
	if !p.AllTenants {
		pipe = append(pipe, bson.D{{Key: "$match", Value: bson.D{{Key: "tenant", Value: p.Tenant}}}})
	}
	pipe = append(pipe, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$status"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}})
	cur, err := s.msgs.Aggregate(ctx, pipe)
	if err != nil {
		return nil, fmt.Errorf("mongo: count: %w", err)
	}
	var rows []struct {
		Status string `bson:"_id"`
		N      int64  `bson:"n"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, fmt.Errorf("mongo: count: %w", err)
	}
	out := make(map[outbox.Status]int64, len(outbox.Statuses()))
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	for _, r := range rows {
		out[outbox.Status(r.Status)] += r.N
	}
	return out, nil
}

// AttemptList implements outbox.Store: the attempts of message p.MessageID
// in p.Tenant, oldest first; an error wrapping outbox.ErrNotFound when the
// message does not exist in the tenant.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	n, err := s.msgs.CountDocuments(ctx, bson.D{{Key: "_id", Value: p.MessageID}, {Key: "tenant", Value: p.Tenant}})
	if err != nil {
		return nil, fmt.Errorf("mongo: attempts of %s: %w", p.MessageID, err)
	}
	if n == 0 {
		return nil, notFound(p.Tenant, p.MessageID)
	}
	cur, err := s.attempts.Find(ctx, bson.D{{Key: "tenant", Value: p.Tenant}, {Key: "msg_id", Value: p.MessageID}},
		options.Find().SetSort(bson.D{{Key: "finished_at", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("mongo: attempts of %s: %w", p.MessageID, err)
	}
	var docs []attemptDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("mongo: attempts of %s: %w", p.MessageID, err)
	}
	out := make([]outbox.Attempt, len(docs))
	for i := range docs {
		out[i] = docs[i].attempt()
	}
	return out, nil
}

// transition moves one message of a tenant by ev, checked with
// outbox.Transition, with update fenced by the status and update time it
// read (retried when another writer got there first).
func (s *Store) transition(ctx context.Context, tenant, id string, ev outbox.Event, update func(d *msgDoc) bson.D) (outbox.Message, error) {
	for try := 0; ; try++ {
		d, err := s.get(ctx, tenant, id)
		if err != nil {
			return outbox.Message{}, err
		}
		if _, err := outbox.Transition(outbox.Status(d.Status), ev); err != nil {
			return outbox.Message{}, fmt.Errorf("mongo: %s message %s: %w", ev, id, err)
		}
		var out msgDoc
		err = s.msgs.FindOneAndUpdate(ctx,
			bson.D{{Key: "_id", Value: id}, {Key: "status", Value: d.Status}, {Key: "updated_at", Value: d.UpdatedAt}},
			update(&d), options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&out)
		if errors.Is(err, mongo.ErrNoDocuments) && try < 3 {
			continue
		}
		if err != nil {
			return outbox.Message{}, fmt.Errorf("mongo: %s message %s: %w", ev, id, err)
		}
		s.Notify()
		return out.message(), nil
	}
}

// MessageRequeue implements outbox.Store: a FAILED message goes back to
// PENDING, due now, with its attempts reset to 0 (its history is kept).
// Other statuses return an error wrapping outbox.ErrInvalidTransition.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	now := s.now(p.Now)
	return s.transition(ctx, p.Tenant, p.ID, outbox.EventRequeue, func(*msgDoc) bson.D { return requeueUpdate(now) })
}

// requeueUpdate is what a requeue at now writes (MessageRequeue,
// MessageRequeueMany). The message starts over: no lease, and no provider
// ID or delivery times (a late receipt for the ID it had must not find
// it).
func requeueUpdate(now time.Time) bson.D {
	return bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: string(outbox.StatusPending)}, {Key: "fin", Value: false},
		{Key: "blocks_group", Value: false}, {Key: "attempts", Value: 0}, {Key: "recoveries", Value: 0}, {Key: "next_at", Value: now}, {Key: "updated_at", Value: now}}},
		{Key: "$unset", Value: bson.D{{Key: "claimed_at", Value: ""}, {Key: "claimed_by", Value: ""},
			{Key: "prov_id", Value: ""}, {Key: "sent_at", Value: ""}, {Key: "delivered_at", Value: ""}, {Key: "read_at", Value: ""}}}}
}

// MessageCancel implements outbox.Store: a PENDING message or a dead letter
// (FAILED) becomes CANCELLED (a dead letter that blocked its group releases
// it); other statuses return an error wrapping outbox.ErrInvalidTransition.
func (s *Store) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	now := s.now(p.Now)
	return s.transition(ctx, p.Tenant, p.ID, outbox.EventCancel, func(*msgDoc) bson.D {
		return bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: string(outbox.StatusCancelled)}, {Key: "fin", Value: true},
			{Key: "blocks_group", Value: false}, {Key: "updated_at", Value: now}}}}
	})
}

// MessagePrune implements outbox.Store: it deletes up to p.Limit (default
// 1000) finished messages (or those of p.Statuses; of p.Topic when set)
// last updated before p.Before, oldest first, with their attempts, across
// all tenants; p.DryRun counts them instead.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	sts := bson.A{}
	for _, st := range p.PruneStatuses() {
		sts = append(sts, string(st))
	}
	filter := bson.D{{Key: "fin", Value: true}, {Key: "status", Value: bson.D{{Key: "$in", Value: sts}}},
		{Key: "updated_at", Value: bson.D{{Key: "$lt", Value: p.Before.UTC()}}}}
	if p.Topic != "" {
		filter = append(filter, bson.E{Key: "topic", Value: p.Topic})
	}
	if p.DryRun {
		n, err := s.msgs.CountDocuments(ctx, filter)
		if err != nil {
			return 0, fmt.Errorf("mongo: prune: count: %w", err)
		}
		return int(n), nil
	}
	var docs []struct {
		ID string `bson:"_id"`
	}
	if err := s.findAll(ctx, filter, &docs,
		options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).SetLimit(int64(limit)).SetProjection(bson.D{{Key: "_id", Value: 1}})); err != nil {
		return 0, fmt.Errorf("mongo: prune: %w", err)
	}
	if len(docs) == 0 {
		return 0, nil
	}
	ids := make(bson.A, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	if _, err := s.attempts.DeleteMany(ctx, bson.D{{Key: "msg_id", Value: bson.D{{Key: "$in", Value: ids}}}}); err != nil {
		return 0, fmt.Errorf("mongo: prune attempts: %w", err)
	}
	r, err := s.msgs.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "fin", Value: true}})
	if err != nil {
		return 0, fmt.Errorf("mongo: prune: %w", err)
	}
	return int(r.DeletedCount), nil
}

// MessageApplyReceipt implements outbox.Store: it finds the message with
// the receipt's provider message ID in the receipt's tenant (else an error
// wrapping outbox.ErrNotFound), applies outbox.ApplyReceipt, and writes the
// result back, fenced by the status and update time it read, when it
// changed.
func (s *Store) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.ReceiptResult{}, err
	}
	r := p.Receipt
	r.At = s.now(r.At)
	for try := 0; ; try++ {
		var d msgDoc
		err := s.msgs.FindOne(ctx, bson.D{{Key: "tenant", Value: r.Tenant}, {Key: "prov_id", Value: r.ProviderMessageID}}).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return outbox.ReceiptResult{}, fmt.Errorf("%w: provider message id %q in tenant %q", outbox.ErrNotFound, r.ProviderMessageID, r.Tenant)
		}
		if err != nil {
			return outbox.ReceiptResult{}, fmt.Errorf("mongo: receipt: %w", err)
		}
		m := d.message()
		next, changed, err := outbox.ApplyReceipt(m, r)
		if err != nil {
			return outbox.ReceiptResult{}, err
		}
		res := outbox.ReceiptResult{Message: m, Changed: changed, Previous: m.Status}
		if !changed {
			return res, nil
		}
		var out msgDoc
		err = s.msgs.FindOneAndUpdate(ctx,
			bson.D{{Key: "_id", Value: d.ID}, {Key: "status", Value: d.Status}, {Key: "updated_at", Value: d.UpdatedAt}},
			bson.D{{Key: "$set", Value: bson.D{
				{Key: "status", Value: string(next.Status)}, {Key: "fin", Value: finished(next.Status)},
				{Key: "sent_at", Value: tp(next.SentAt)}, {Key: "delivered_at", Value: tp(next.DeliveredAt)}, {Key: "read_at", Value: tp(next.ReadAt)},
				{Key: "last_error", Value: errOf(next.LastError)}, {Key: "updated_at", Value: s.now(s.clock.Now())},
			}}}, options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&out)
		if errors.Is(err, mongo.ErrNoDocuments) && try < 3 {
			continue
		}
		if err != nil {
			return outbox.ReceiptResult{}, fmt.Errorf("mongo: receipt: %w", err)
		}
		res.Message = out.message()
		return res, nil
	}
}

// DeadLetterBlocking implements outbox.DeadLetterBlocker: a dead letter
// recorded with BlockGroup stays among its group's open documents (fin
// false), where the claim stops.
func (s *Store) DeadLetterBlocking() bool { return true }

var _ outbox.DeadLetterBlocker = (*Store)(nil)
