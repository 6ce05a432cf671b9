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

type inboxDoc struct {
	ID       string    `bson:"_id"` // lenKey(consumer, tenant, message ID)
	Consumer string    `bson:"consumer"`
	Tenant   string    `bson:"tenant"`
	MsgID    string    `bson:"msg_id"`
	At       time.Time `bson:"at"`
}

// InboxClaimTx implements outbox.InboxStore[context.Context]: it records
// in the caller's session (tx, the context that carries it) that consumer
// handles the message, and reports whether this is the first time. In a
// transaction the record is looked up first, so a repeat never aborts the
// transaction; two transactions recording the same message at once do not
// wait for each other as in SQL: the server aborts one with a write
// conflict, and Session.WithTransaction runs it again, when it then sees
// the record. Without a transaction the record is one insert whose unique
// _id decides who is first.
func (s *Store) InboxClaimTx(ctx context.Context, tx context.Context, p outbox.InboxClaimParams) (bool, error) {
	if err := p.Validate(); err != nil {
		return false, err
	}
	if tx == nil {
		return false, outbox.InvalidParam("tx", "is nil")
	}
	sess := mongo.SessionFromContext(tx)
	if sess == nil {
		return false, outbox.InvalidParam("tx", "carries no session")
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	id := lenKey(p.Consumer, p.Tenant, p.MessageID)
	if sess.TransactionRunning() {
		err := s.inbox.FindOne(sctx, bson.D{{Key: "_id", Value: id}}).Err()
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return false, fmt.Errorf("mongo: inbox: %w", err)
		}
	}
	_, err := s.inbox.InsertOne(sctx, inboxDoc{ID: id, Consumer: p.Consumer, Tenant: p.Tenant, MsgID: p.MessageID, At: s.now(p.Now)})
	if err == nil {
		return true, nil
	}
	if mongo.IsDuplicateKeyError(err) && !sess.TransactionRunning() {
		return false, nil
	}
	return false, fmt.Errorf("mongo: inbox: %w", err)
}

// InboxPrune implements outbox.InboxStore: it deletes up to p.Limit
// (default 1000) records older than p.Before.
func (s *Store) InboxPrune(ctx context.Context, p outbox.InboxPruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	cur, err := s.inbox.Find(ctx, bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: p.Before.UTC()}}}},
		options.Find().SetSort(bson.D{{Key: "at", Value: 1}}).SetLimit(int64(limit)).SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return 0, fmt.Errorf("mongo: inbox prune: %w", err)
	}
	var docs []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return 0, fmt.Errorf("mongo: inbox prune: %w", err)
	}
	if len(docs) == 0 {
		return 0, nil
	}
	ids := make(bson.A, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	r, err := s.inbox.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return 0, fmt.Errorf("mongo: inbox prune: %w", err)
	}
	return int(r.DeletedCount), nil
}
