package mongo_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodriver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

type mongoBundle struct {
	DB    *mongodriver.Database
	Store *mongo.Store
}

// setup returns a Store over seed 004's collections in a fresh
// database of the test MongoDB server (FerretDB in CI).
func setup(t *testing.T) *mongoBundle {
	t.Helper()
	m := testbackend.Mongo(t)
	st, err := mongo.New(m.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &mongoBundle{DB: m.DB, Store: st}
}

func (b *mongoBundle) coll(topic string) *mongodriver.Collection {
	if topic == flowcatalyst.TopicDispatchJob {
		return b.DB.Collection(mongo.DefaultDispatchJobsTable)
	}
	return b.DB.Collection(mongo.DefaultEventsTable)
}

// insertPlain writes documents as a non-Go client would with insertOne:
// the seed's fields, a null or missing messageGroup for group "".
func (b *mongoBundle) insertPlain(t *testing.T, topic, id, group string, n int, at time.Time) {
	t.Helper()
	doc := bson.D{{Key: "_id", Value: id}, {Key: "type", Value: topic}}
	switch {
	case group != "":
		doc = append(doc, bson.E{Key: "messageGroup", Value: group})
	case n%2 == 0:
		doc = append(doc, bson.E{Key: "messageGroup", Value: nil})
	}
	doc = append(doc, bson.E{Key: "payload", Value: fmt.Sprintf(`{"group":%q,"n":%d}`, group, n)},
		bson.E{Key: "status", Value: "PENDING"}, bson.E{Key: "retryCount", Value: 0},
		bson.E{Key: "createdAt", Value: at}, bson.E{Key: "processedAt", Value: nil}, bson.E{Key: "errorMessage", Value: nil})
	if _, err := b.coll(topic).InsertOne(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
}

func (b *mongoBundle) count(t *testing.T, topic string, filter bson.D) int {
	t.Helper()
	n, err := b.coll(topic).CountDocuments(context.Background(), filter)
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}
