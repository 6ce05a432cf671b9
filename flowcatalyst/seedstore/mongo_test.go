package seedstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

type mongoBundle struct {
	db    *mongo.Database
	store *seedstore.Store
}

// setupMongo returns a Store over seed 004's collections in a fresh
// database of the test MongoDB server (FerretDB in CI).
func setupMongo(t *testing.T) *mongoBundle {
	t.Helper()
	m := testbackend.Mongo(t)
	st, err := seedstore.NewMongo(m.DB, seedstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &mongoBundle{db: m.DB, store: st}
}

func (b *mongoBundle) coll(topic string) *mongo.Collection {
	if topic == flowcatalyst.TopicDispatchJob {
		return b.db.Collection(seedstore.DefaultDispatchJobsTable)
	}
	return b.db.Collection(seedstore.DefaultEventsTable)
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

// Documents written by plain insertOne (null and missing messageGroup
// included) are all delivered, once each and in order per group, by two
// processors on two Stores at once; a null group is the FIFO group
// "default".
func TestMongoProcessorsDeliverPlainDocumentsInFIFOOrder(t *testing.T) {
	t.Parallel()
	b := setupMongo(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	want := map[string]int{}
	at := time.Now().UTC().Add(-time.Hour)
	for i := 0; i < 60; i++ {
		for _, g := range []string{"a", "b", "c", ""} {
			at = at.Add(time.Millisecond)
			b.insertPlain(t, flowcatalyst.TopicEvent, fmt.Sprintf("E%s%03d", g, i), g, i, at)
			want[g]++
		}
	}
	var nullGroups atomic.Int64
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	other, err := seedstore.NewMongo(b.db, seedstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.Topics = b.store.Topics()
	cfg.PollBatchSize = 20
	cfg.Observer = groupRecorder{null: &nullGroups}
	stop1 := run(t, b.store, pub, cfg)
	stop2 := run(t, other, pub, cfg)
	waitFor(t, "every document COMPLETED", 90*time.Second, func() bool {
		return b.count(t, flowcatalyst.TopicEvent, bson.D{{Key: "status", Value: "COMPLETED"}}) == 240
	})
	stop1()
	stop2()
	stored := srv.Items(flowcatalyst.CurrentAPI.EventsPath)
	// checkFIFO orders only named groups; the null group is checked here.
	next := 0
	for _, raw := range stored {
		var it item
		if err := json.Unmarshal(raw, &it); err != nil {
			t.Fatal(err)
		}
		if it.Group == "" {
			if it.N != next {
				t.Errorf("null group: item %d after %d", it.N, next-1)
			}
			next = it.N + 1
		}
	}
	checkFIFO(t, stored, want)
	if nullGroups.Load() == 0 {
		t.Error("no message of the null group was reported in group \"default\"")
	}
}

type groupRecorder struct {
	outbox.NopObserver
	null *atomic.Int64
}

func (g groupRecorder) OnSent(_ context.Context, e outbox.AttemptEvent) {
	if e.Message.Group == seedstore.DefaultNullGroup {
		g.null.Add(1)
	}
}
