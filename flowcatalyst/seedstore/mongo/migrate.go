package mongo

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// CreateTables creates the seed's index {status: 1, messageGroup: 1,
// createdAt: 1} on both collections (collections come into being with
// their first document), when it does not exist yet.
func (s *Store) CreateTables(ctx context.Context) error {
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
