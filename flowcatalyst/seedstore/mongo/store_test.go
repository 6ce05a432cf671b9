package mongo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	"github.com/outboxkit/outboxkit/outbox"
)

// Documents written by plain insertOne (null and missing messageGroup
// included) are all delivered, once each and in order per group, by two
// processors on two Stores at once; a null group is the FIFO group
// "default".
func TestProcessorsDeliverPlainDocumentsInFIFOOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
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
	other, err := mongo.New(b.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := seedtest.FastConfig()
	cfg.Topics = b.Store.Topics()
	cfg.PollBatchSize = 20
	cfg.Observer = groupRecorder{null: &nullGroups}
	stop1 := seedtest.Run(t, b.Store, pub, cfg)
	stop2 := seedtest.Run(t, other, pub, cfg)
	seedtest.WaitFor(t, "every document COMPLETED", 90*time.Second, func() bool {
		return b.count(t, flowcatalyst.TopicEvent, bson.D{{Key: "status", Value: "COMPLETED"}}) == 240
	})
	stop1()
	stop2()
	stored := srv.Items(flowcatalyst.CurrentAPI.EventsPath)
	// checkFIFO orders only named groups; the null group is checked here.
	next := 0
	for _, raw := range stored {
		var it seedtest.Item
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
	seedtest.CheckFIFO(t, stored, want)
	if nullGroups.Load() == 0 {
		t.Error("no message of the null group was reported in group \"default\"")
	}
}

type groupRecorder struct {
	outbox.NopObserver
	null *atomic.Int64
}

func (g groupRecorder) OnSent(_ context.Context, e outbox.AttemptEvent) {
	if e.Message.Group == mongo.DefaultNullGroup {
		g.null.Add(1)
	}
}

// Documents inserted late with an earlier createdAt than their group's
// document in flight wait for it, even when there are more of them than a
// claim reads (the claim's look at the groups then sees only them): the
// group's own read under its lock puts PROCESSING documents first.
func TestLateDocumentsWaitForTheirGroupInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	b.insertPlain(t, flowcatalyst.TopicEvent, "A", "g", 10, at.Add(10*time.Millisecond))
	b.insertPlain(t, flowcatalyst.TopicEvent, "C", "g", 11, at.Add(11*time.Millisecond))
	first := seedtest.Claim(t, b.Store, 1, time.Now())
	if got := seedtest.IDs(first); len(got) != 1 || got[0] != "A" {
		t.Fatalf("first claim: %v, want [A]", got)
	}
	want := []string{}
	for i := 1; i <= 6; i++ {
		id := fmt.Sprint("B", i)
		b.insertPlain(t, flowcatalyst.TopicEvent, id, "g", i, at.Add(time.Duration(i)*time.Millisecond))
		want = append(want, id)
	}
	if got := seedtest.IDs(seedtest.Claim(t, b.Store, 1, time.Now())); len(got) != 0 {
		t.Fatalf("claimed %v while A of the same group is in flight", got)
	}
	res, err := b.Store.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Now: time.Now(),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, Topic: first[0].Topic, ID: "A", Attempt: first[0].Attempts, ClaimToken: first[0].ClaimToken}}})
	if err != nil || len(res.LeaseLost) > 0 {
		t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
	}
	want = append(want, "C")
	if got := seedtest.IDs(seedtest.Claim(t, b.Store, 10, time.Now())); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after A: %v, want %v", got, want)
	}
}

// A group named "" (a string, not null) is claimed from the first claim
// on, like any other group.
func TestEmptyStringGroupIsClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.coll(flowcatalyst.TopicEvent).InsertOne(context.Background(), bson.D{{Key: "_id", Value: "E1"}, {Key: "type", Value: "EVENT"},
		{Key: "messageGroup", Value: ""}, {Key: "payload", Value: `{}`}, {Key: "status", Value: "PENDING"}, {Key: "retryCount", Value: 0},
		{Key: "createdAt", Value: time.Now().UTC().Add(-time.Minute)}, {Key: "processedAt", Value: nil}, {Key: "errorMessage", Value: nil}})
	if err != nil {
		t.Fatal(err)
	}
	if got := seedtest.IDs(seedtest.Claim(t, b.Store, 10, time.Now())); len(got) != 1 || got[0] != "E1" {
		t.Fatalf("claimed %v, want [E1]", got)
	}
}

// A lost lease is reported by a finish on MongoDB: the outcome of a
// document recovered (and claimed again) since its claim does not apply,
// the others of the same finish do.
func TestFinishReportsLostLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := time.Now().UTC().Add(-time.Hour)
	b.insertPlain(t, flowcatalyst.TopicEvent, "A", "a", 1, at)
	b.insertPlain(t, flowcatalyst.TopicEvent, "B", "b", 1, at.Add(time.Millisecond))
	// A Store's first claim hands out its first group at once.
	msgs := seedtest.Claim(t, b.Store, 10, time.Now())
	msgs = append(msgs, seedtest.Claim(t, b.Store, 10, time.Now())...)
	if len(msgs) != 2 {
		t.Fatalf("claimed %v, want A and B", seedtest.IDs(msgs))
	}
	// A's lease is lost: recovered by another processor and claimed again.
	other, err := mongo.New(b.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll(flowcatalyst.TopicEvent).UpdateOne(context.Background(), bson.D{{Key: "_id", Value: "A"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "PENDING"}, {Key: "processedAt", Value: nil}}}}); err != nil {
		t.Fatal(err)
	}
	if got := seedtest.IDs(seedtest.Claim(t, other, 10, time.Now())); len(got) != 1 || got[0] != "A" {
		t.Fatalf("the other store claimed %v, want [A]", got)
	}
	var outcomes []outbox.Outcome
	for _, m := range msgs {
		outcomes = append(outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
	}
	res, err := b.Store.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Now: time.Now(), Outcomes: outcomes})
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

// The same on MongoDB: 2,500 documents in 50 groups in each collection,
// written by insertMany; the first request goes out within one poll
// interval plus ten of the seed's own one-document fetch-and-lock
// (findOneAndUpdate sorted by messageGroup, createdAt) on the same
// collection, the seed's processor making 500 of those before its first
// send. The allowance scales with the server's speed: FerretDB scans the
// collection for every command.
func TestFirstSendOnAFreshCollectionWithinOnePollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := time.Now().UTC().Add(-time.Hour)
	for _, topic := range []string{flowcatalyst.TopicEvent, flowcatalyst.TopicDispatchJob} {
		var docs []any
		for i := 1; i <= 2500; i++ {
			docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprint("R", i)}, {Key: "type", Value: topic},
				{Key: "messageGroup", Value: fmt.Sprint("group-", i%50)}, {Key: "payload", Value: fmt.Sprintf(`{"n":%d}`, i)},
				{Key: "status", Value: "PENDING"}, {Key: "retryCount", Value: 0},
				{Key: "createdAt", Value: at.Add(time.Duration(i) * time.Millisecond)}, {Key: "processedAt", Value: nil}, {Key: "errorMessage", Value: nil}})
		}
		for start := 0; start < len(docs); start += 500 {
			if _, err := b.coll(topic).InsertMany(ctx, docs[start:start+500]); err != nil {
				t.Fatal(err)
			}
		}
	}
	coll := b.coll(flowcatalyst.TopicEvent)
	ref := time.Now()
	var doc bson.M
	if err := coll.FindOneAndUpdate(ctx, bson.D{{Key: "status", Value: "PENDING"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "processedAt", Value: time.Now()}}}},
		options.FindOneAndUpdate().SetSort(bson.D{{Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}})).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	seedOne := time.Since(ref)
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: doc["_id"]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "processedAt", Value: nil}}}}); err != nil {
		t.Fatal(err)
	}

	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	var once sync.Once
	first := make(chan time.Time, 1)
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		once.Do(func() { first <- time.Now() })
		return nil
	})
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cfg := seedtest.FastConfig()
	cfg.PollInterval = time.Second
	cfg.PollBatchSize, cfg.PublishBatchSize, cfg.BufferSize = 500, 100, 1000
	p, err := outbox.NewProcessor(b.Store, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	select {
	case at := <-first:
		d, allowed := at.Sub(start), cfg.PollInterval+10*seedOne
		t.Logf("first request %s after the start; the seed's one-document claim took %s", d, seedOne)
		if d > allowed {
			t.Errorf("the first request went out %s after the start, more than one poll interval (%s) plus ten of the seed's one-document claims (%s)", d, cfg.PollInterval, seedOne)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no request within 60 s of the start")
	}
}
