package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageGet returns one document by id (tenant must be ""), looking in
// the events collection first. An id that is the hex form of an ObjectId
// also matches that ObjectId.
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.tables {
		r, found, err := s.get(ctx, t, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
		}
		if found {
			return s.core.Message(&r, t.topic), nil
		}
	}
	return outbox.Message{}, outbox.ErrNotFound
}

// MessageList returns documents ordered by _id (a TSID, so by creation),
// filtered by status, topic and group. Pagination (AfterSeq) works for
// TSID ids.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	q, ok, err := seedcore.BeginList(p)
	if err != nil || !ok {
		return outbox.MessagePage{}, err
	}
	var all []outbox.Message
	for _, t := range s.tables {
		if q.Topic != "" && q.Topic != t.topic {
			continue
		}
		rows, err := s.list(ctx, t, q.After, q.Status, q.Group, q.Limit+1)
		if err != nil {
			return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
		}
		for i := range rows {
			all = append(all, s.core.Message(&rows[i], t.topic))
		}
	}
	return q.Page(all), nil
}

// MessageCount counts documents of both collections by status (COMPLETED
// counts as SENT; every outbox status is present).
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	out := seedcore.NewCounts()
	if p.Tenant != "" && !p.AllTenants {
		return out, nil
	}
	for _, t := range s.tables {
		counts, err := s.count(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("seedstore: count: %w", err)
		}
		for st, n := range counts {
			out[seedcore.OutboxStatus(st)] += n
		}
	}
	return out, nil
}

// MessageRequeue moves a FAILED document back to PENDING, due now, with
// retryCount 0 and no error message.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return outbox.Message{}, err
	}
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.tables {
		ok, err := s.requeue(ctx, t, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: requeue: %w", err)
		}
		if ok {
			return s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
		}
	}
	m, err := s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
	if err != nil {
		return outbox.Message{}, err
	}
	return outbox.Message{}, seedcore.RequeueRefused(m)
}

// MessagePrune deletes COMPLETED and FAILED documents finished before
// p.Before, at most p.Limit (default 1000) per collection and call. It
// refuses p.Statuses, p.Topic and p.DryRun (outbox.ErrInvalidInput) rather
// than delete more than asked.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	limit, err := seedcore.PruneLimit(p)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, t := range s.tables {
		n, err := s.prune(ctx, t, seedcore.At(p.Before).Truncate(time.Millisecond), limit)
		total += n
		if err != nil {
			return total, fmt.Errorf("seedstore: prune: %w", err)
		}
	}
	return total, nil
}

// AttemptList returns no attempts: the seed collections keep none. It
// returns outbox.ErrNotFound when the document does not exist.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if _, err := s.MessageGet(ctx, outbox.MessageGetParams{Tenant: p.Tenant, ID: p.MessageID}); err != nil {
		return nil, err
	}
	return nil, nil
}

// MessageApplyReceipt returns outbox.ErrNotFound: FlowCatalyst sends no
// receipts and the seed collections have no provider message id.
func (s *Store) MessageApplyReceipt(context.Context, outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return outbox.ReceiptResult{}, outbox.ErrNotFound
}

// MessageCancel returns an error matching errors.ErrUnsupported: the seed
// has no CANCELLED status, and writing one would break the seed's readers.
func (s *Store) MessageCancel(context.Context, outbox.MessageCancelParams) (outbox.Message, error) {
	return outbox.Message{}, seedcore.ErrCancel
}

// get returns the document with id from t, or false.
func (s *Store) get(ctx context.Context, t *table, id string) (seedcore.Row, bool, error) {
	rows, err := findRows(ctx, t.coll, idFilter([]string{id}), options.Find().SetLimit(1))
	if err != nil || len(rows) == 0 {
		return seedcore.Row{}, false, err
	}
	return rows[0], true, nil
}

// list returns up to limit documents of t ordered by _id, after the id
// after, with status and group when set.
func (s *Store) list(ctx context.Context, t *table, after, status, group string, limit int) ([]seedcore.Row, error) {
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

// count counts t's documents by status.
func (s *Store) count(ctx context.Context, t *table) (map[string]int64, error) {
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

// requeue moves t's FAILED document id back to PENDING.
func (s *Store) requeue(ctx context.Context, t *table, id string) (bool, error) {
	res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusFailed}}, idFilter([]string{id})...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusPending}, {Key: "retryCount", Value: 0},
			{Key: "processedAt", Value: nil}, {Key: "errorMessage", Value: nil}}}})
	if err != nil {
		return false, err
	}
	return res.MatchedCount > 0, nil
}

// prune deletes up to limit of t's COMPLETED and FAILED documents
// finished before before.
func (s *Store) prune(ctx context.Context, t *table, before time.Time, limit int) (int, error) {
	rows, err := findRows(ctx, t.coll, bson.D{
		{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusCompleted, StatusFailed}}}},
		{Key: "processedAt", Value: bson.D{{Key: "$lt", Value: before}}},
	}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetSort(bson.D{{Key: "processedAt", Value: 1}}).SetLimit(int64(limit)))
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].ID
	}
	total := 0
	for start := 0; start < len(ids); start += writeChunk {
		res, err := t.coll.DeleteMany(ctx, append(idFilter(ids[start:min(start+writeChunk, len(ids))]),
			bson.E{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusCompleted, StatusFailed}}}}))
		if err != nil {
			return total, err
		}
		total += int(res.DeletedCount)
	}
	return total, nil
}
