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

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.PendingTopicLister = (*Store)(nil)

// MessagePendingTopics implements outbox.PendingTopicLister: the topics
// with PENDING messages due at or before p.DueBefore, across tenants, in
// topic order, but those in p.ExcludeTopics, which the match leaves out.
// The processor uses it to report topics nobody publishes. One
// aggregation counts the messages by topic; the oldest due time of each
// topic is then one query (status_topic_created index): aggregation's
// $min would give it in the same pass, but FerretDB does not implement
// it.
func (s *Store) MessagePendingTopics(ctx context.Context, p outbox.MessagePendingTopicsParams) ([]outbox.PendingTopic, error) {
	match := bson.D{
		{Key: "status", Value: string(outbox.StatusPending)},
		{Key: "next_at", Value: bson.D{{Key: "$lte", Value: p.DueBefore}}},
	}
	if len(p.ExcludeTopics) > 0 {
		match = append(match, bson.E{Key: "topic", Value: bson.D{{Key: "$nin", Value: p.ExcludeTopics}}})
	}
	cur, err := s.msgs.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: match}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$topic"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("mongo: pending topics: %w", err)
	}
	var rows []struct {
		Topic string `bson:"_id"`
		N     int64  `bson:"n"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, fmt.Errorf("mongo: pending topics: %w", err)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Topic < rows[j].Topic })
	out := make([]outbox.PendingTopic, 0, len(rows))
	for _, r := range rows {
		var d struct {
			NextAt time.Time `bson:"next_at"`
		}
		f := append(bson.D{{Key: "topic", Value: r.Topic}}, match[:2]...)
		err := s.msgs.FindOne(ctx, f, options.FindOne().SetSort(bson.D{{Key: "next_at", Value: 1}}).
			SetProjection(bson.D{{Key: "next_at", Value: 1}})).Decode(&d)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments): // claimed meanwhile
			continue
		case err != nil:
			return nil, fmt.Errorf("mongo: pending topics: oldest of %q: %w", r.Topic, err)
		}
		out = append(out, outbox.PendingTopic{Topic: r.Topic, Messages: r.N, OldestDueAt: d.NextAt.UTC()})
	}
	return out, nil
}
