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

// Documents inserted late with an earlier createdAt than their group's
// document in flight wait for it, even when there are more of them than a
// claim reads (the claim's look at the groups then sees only them): the
// group's own read under its lock puts PROCESSING documents first.
func TestMongoLateDocumentsWaitForTheirGroupInFlight(t *testing.T) {
	t.Parallel()
	b := setupMongo(t)
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	b.insertPlain(t, flowcatalyst.TopicEvent, "A", "g", 10, at.Add(10*time.Millisecond))
	b.insertPlain(t, flowcatalyst.TopicEvent, "C", "g", 11, at.Add(11*time.Millisecond))
	first := claim(t, b.store, 1, time.Now())
	if got := ids(first); len(got) != 1 || got[0] != "A" {
		t.Fatalf("first claim: %v, want [A]", got)
	}
	want := []string{}
	for i := 1; i <= 6; i++ {
		id := fmt.Sprint("B", i)
		b.insertPlain(t, flowcatalyst.TopicEvent, id, "g", i, at.Add(time.Duration(i)*time.Millisecond))
		want = append(want, id)
	}
	if got := ids(claim(t, b.store, 1, time.Now())); len(got) != 0 {
		t.Fatalf("claimed %v while A of the same group is in flight", got)
	}
	res, err := b.store.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Now: time.Now(),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, Topic: first[0].Topic, ID: "A", Attempt: first[0].Attempts}}})
	if err != nil || len(res.LeaseLost) > 0 {
		t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
	}
	want = append(want, "C")
	if got := ids(claim(t, b.store, 10, time.Now())); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after A: %v, want %v", got, want)
	}
}

// A group named "" (a string, not null) is claimed from the first claim
// on, like any other group.
func TestMongoEmptyStringGroupIsClaimed(t *testing.T) {
	t.Parallel()
	b := setupMongo(t)
	_, err := b.coll(flowcatalyst.TopicEvent).InsertOne(context.Background(), bson.D{{Key: "_id", Value: "E1"}, {Key: "type", Value: "EVENT"},
		{Key: "messageGroup", Value: ""}, {Key: "payload", Value: `{}`}, {Key: "status", Value: "PENDING"}, {Key: "retryCount", Value: 0},
		{Key: "createdAt", Value: time.Now().UTC().Add(-time.Minute)}, {Key: "processedAt", Value: nil}, {Key: "errorMessage", Value: nil}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(claim(t, b.store, 10, time.Now())); len(got) != 1 || got[0] != "E1" {
		t.Fatalf("claimed %v, want [E1]", got)
	}
}

// A lost lease is reported by a finish on MongoDB: the outcome of a
// document recovered (and claimed again) since its claim does not apply,
// the others of the same finish do.
func TestMongoFinishReportsLostLeases(t *testing.T) {
	t.Parallel()
	b := setupMongo(t)
	at := time.Now().UTC().Add(-time.Hour)
	b.insertPlain(t, flowcatalyst.TopicEvent, "A", "a", 1, at)
	b.insertPlain(t, flowcatalyst.TopicEvent, "B", "b", 1, at.Add(time.Millisecond))
	// A Store's first claim hands out its first group at once.
	msgs := claim(t, b.store, 10, time.Now())
	msgs = append(msgs, claim(t, b.store, 10, time.Now())...)
	if len(msgs) != 2 {
		t.Fatalf("claimed %v, want A and B", ids(msgs))
	}
	// A's lease is lost: recovered by another processor and claimed again.
	other, err := seedstore.NewMongo(b.db, seedstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll(flowcatalyst.TopicEvent).UpdateOne(context.Background(), bson.D{{Key: "_id", Value: "A"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "PENDING"}, {Key: "processedAt", Value: nil}}}}); err != nil {
		t.Fatal(err)
	}
	if got := ids(claim(t, other, 10, time.Now())); len(got) != 1 || got[0] != "A" {
		t.Fatalf("the other store claimed %v, want [A]", got)
	}
	var outcomes []outbox.Outcome
	for _, m := range msgs {
		outcomes = append(outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts})
	}
	res, err := b.store.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Now: time.Now(), Outcomes: outcomes})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.LeaseLost) != 1 || res.LeaseLost[0] != "A" {
		t.Errorf("leases lost %v, want [A]", res.LeaseLost)
	}
	if n := b.count(t, flowcatalyst.TopicEvent, bson.D{{Key: "_id", Value: "A"}, {Key: "status", Value: "PROCESSING"}}); n != 1 {
		t.Error("A's outcome was applied over the other processor's lease")
	}
	if n := b.count(t, flowcatalyst.TopicEvent, bson.D{{Key: "_id", Value: "B"}, {Key: "status", Value: "COMPLETED"}}); n != 1 {
		t.Error("B's outcome was not applied")
	}
}
