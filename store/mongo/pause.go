package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

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
	if err := outbox.ValidatePause(p.Topic, p.Group, p.Tenant); err != nil {
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
	if err := outbox.ValidatePause(p.Topic, p.Group, p.Tenant); err != nil {
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
