package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongooptions "go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// setupE2EMongo returns a fresh MongoDB database (FerretDB in CI) for seed
// 004's collections, with the seed's index created by a plain command, as
// an operator would.
func setupE2EMongo(t *testing.T) *e2e {
	t.Helper()
	m := testbackend.Mongo(t)
	e := &e2e{dsn: testbackend.MongoURI(t), mongo: m.DB, srv: flowcatalysttest.NewServer()}
	t.Cleanup(e.srv.Close)
	for _, c := range []string{"outbox_events", "outbox_dispatch_jobs"} {
		if err := m.DB.RunCommand(context.Background(), bson.D{{Key: "createIndexes", Value: c}, {Key: "indexes", Value: bson.A{
			bson.D{{Key: "key", Value: bson.D{{Key: "status", Value: 1}, {Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}}}, {Key: "name", Value: "status_group_created"}},
		}}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// insertMongo writes n documents in groups into topic's collection as any
// MongoDB client would (insertMany with the seed's fields), ids prefix+i,
// a millisecond apart.
func (e *e2e) insertMongo(t *testing.T, topic, prefix string, groups, n int) {
	t.Helper()
	at := time.Now().UTC().Add(-time.Hour)
	var docs []any
	for i := 1; i <= n; i++ {
		g := fmt.Sprint("g", i%groups)
		docs = append(docs, bson.D{
			{Key: "_id", Value: fmt.Sprint(prefix, i)}, {Key: "type", Value: topic}, {Key: "messageGroup", Value: g},
			{Key: "payload", Value: fmt.Sprintf(`{"topic":%q,"group":%q,"n":%d}`, topic, g, i)},
			{Key: "status", Value: "PENDING"}, {Key: "retryCount", Value: 0},
			{Key: "createdAt", Value: at.Add(time.Duration(i) * time.Millisecond)}, {Key: "processedAt", Value: nil}, {Key: "errorMessage", Value: nil},
		})
	}
	for start := 0; start < len(docs); start += 500 {
		if _, err := e.mongo.Collection(e.table(topic)).InsertMany(context.Background(), docs[start:min(start+500, len(docs))]); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *e2e) countMongo(t *testing.T, topic string, filter bson.D) int {
	t.Helper()
	n, err := e.mongo.Collection(e.table(topic)).CountDocuments(context.Background(), filter)
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func TestEndToEndMongoIDsSharedAcrossTables(t *testing.T) {
	t.Parallel()
	// A finish cut off by the client's timeout on a busy FerretDB leaves
	// its rows PROCESSING until recovery: a lease shorter than the seed's
	// 300 s brings them back within the test's wait.
	testIDsSharedAcrossTables(t, setupE2EMongo(t), "-processing-timeout-seconds", "30", "-recovery-interval", "1s", "-drain-timeout", "2s")
}

func TestEndToEndMongoKillAndRestart(t *testing.T) {
	t.Parallel()
	// FerretDB writes each document of an update on its own: fewer rows
	// than on the SQL databases keep the test short, and a longer
	// processing timeout keeps a busy FerretDB's slow round of claim, send
	// and finish from outliving its lease (the processor would then
	// recover its own rows over and over).
	testKillAndRestart(t, setupE2EMongo(t), 100, 15)
}

// The program on MongoDB: documents inserted plainly with ids shared
// across the two collections, every fifth request failing with 503, two
// replicas of which one is active (the lease document), a clean stop.
func TestEndToEndMongo(t *testing.T) {
	t.Parallel()
	e := setupE2EMongo(t)
	var requests atomic.Int64
	e.srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		if requests.Add(1)%5 == 0 {
			return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"try again"}`)}
		}
		return nil
	})
	const n = 80
	e.insert(t, "EVENT", "P", 4, n)
	e.insert(t, "DISPATCH_JOB", "P", 4, n)
	args := []string{"-api-batch-size", "10", "-max-retries", "20", "-single-active"}
	a, la := e.start(t, args...)
	b, lb := e.start(t, args...)
	defer func() {
		if t.Failed() {
			for _, topic := range []string{"EVENT", "DISPATCH_JOB"} {
				t.Logf("%s: %d PENDING, %d PROCESSING, %d COMPLETED, %d FAILED", topic, e.count(t, topic, "PENDING"),
					e.count(t, topic, "PROCESSING"), e.count(t, topic, "COMPLETED"), e.count(t, topic, "FAILED"))
			}
		}
	}()
	waitLong(t, "every document COMPLETED", func() bool {
		return e.count(t, "EVENT", "COMPLETED") == n && e.count(t, "DISPATCH_JOB", "COMPLETED") == n
	})
	active := strings.Count(la.String(), "now the active one") + strings.Count(lb.String(), "now the active one")
	stop(t, a, la)
	stop(t, b, lb)
	if active != 1 {
		t.Errorf("%d replicas became active while both ran, want 1:\n%s\n%s", active, la.String(), lb.String())
	}
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.EventsPath), 4, n, true)
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.DispatchJobsPath), 4, n, true)
	retried := e.countMongo(t, "EVENT", bson.D{{Key: "retryCount", Value: bson.D{{Key: "$gt", Value: 0}}}}) +
		e.countMongo(t, "DISPATCH_JOB", bson.D{{Key: "retryCount", Value: bson.D{{Key: "$gt", Value: 0}}}})
	if retried == 0 {
		t.Error("no document was charged a retry although every fifth request failed")
	}
	if n, err := e.mongo.Collection("outbox_processor_locks").CountDocuments(context.Background(), bson.D{}); err != nil || n != 0 {
		t.Errorf("%d lock or lease documents left after a clean stop (%v)", n, err)
	}
}

// Two replicas without single-active share the work through the group
// locks: every document is sent exactly once and in order per group.
func TestEndToEndMongoTwoReplicas(t *testing.T) {
	t.Parallel()
	e := setupE2EMongo(t)
	e.insert(t, "EVENT", "E", 8, 120)
	a, la := e.start(t, "-api-batch-size", "10", "-poll-batch-size", "40")
	b, lb := e.start(t, "-api-batch-size", "10", "-poll-batch-size", "40")
	waitLong(t, "every document COMPLETED", func() bool { return e.count(t, "EVENT", "COMPLETED") == 120 })
	stop(t, a, la)
	stop(t, b, lb)
	checkStored(t, e.srv.Items(flowcatalyst.CurrentAPI.EventsPath), 8, 120, true)
}

// A fresh collection of 2,500 documents does not stall the start: the
// first request goes out within one poll interval plus ten times the
// seed's own fetch-and-lock of ONE document (findOneAndUpdate sorted by
// messageGroup, createdAt) on the same collection; the seed's processor
// makes poll-batch-size (500) of those before its first send. The
// allowance scales with the server's speed (FerretDB on a busy machine is
// slow); on MongoDB both are milliseconds.
func TestEndToEndMongoFirstSendWithinOnePollInterval(t *testing.T) {
	t.Parallel()
	e := setupE2EMongo(t)
	e.insert(t, "EVENT", "F", 50, 2500)
	coll := e.mongo.Collection("outbox_events")
	ref := time.Now()
	var doc bson.M
	if err := coll.FindOneAndUpdate(context.Background(), bson.D{{Key: "status", Value: "PENDING"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "processedAt", Value: time.Now()}}}},
		mongooptions.FindOneAndUpdate().SetSort(bson.D{{Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}})).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	seedOne := time.Since(ref)
	// Undo: the document stays PENDING and due.
	if _, err := coll.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: doc["_id"]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "processedAt", Value: nil}}}}); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	first := make(chan time.Time, 1)
	e.srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		once.Do(func() { first <- time.Now() })
		return nil
	})
	start := time.Now()
	cmd, logs := e.start(t, "-poll-interval", "1s")
	select {
	case at := <-first:
		// The program's own start (process, connection) is not the claim's.
		started := startedAt(t, logs, start)
		d, allowed := at.Sub(started), time.Second+10*seedOne
		t.Logf("first request %s after the start; the seed's one-document claim took %s", d, seedOne)
		if d > allowed {
			t.Errorf("the first request went out %s after the start, more than one poll interval (1s) plus ten of the seed's one-document claims (%s)", d, seedOne)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("no request within 120 s of the start")
	}
	stop(t, cmd, logs)
	if n := e.count(t, "EVENT", "PROCESSING"); n != 0 {
		t.Errorf("%d documents left PROCESSING after a clean stop", n)
	}
}

// startedAt returns when the program logged that it started (the
// processor's start), waiting for the line; start if it never comes.
func startedAt(t *testing.T, logs *syncBuffer, start time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(logs.String(), "\n") {
			if !strings.Contains(line, "processor starting") {
				continue
			}
			var rec struct {
				Time time.Time `json:"time"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err == nil && !rec.Time.IsZero() {
				return rec.Time
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return start
}
