package seedstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// countingStore counts the claims a processor makes and remembers how many
// rows the first one returned.
type countingStore struct {
	*seedstore.Store
	claims atomic.Int64
	first  atomic.Int64
}

func (c *countingStore) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	msgs, err := c.Store.MessageClaim(ctx, p)
	if c.claims.Add(1) == 1 {
		c.first.Store(int64(len(msgs)))
	}
	return msgs, err
}

// A fresh table (no statistics: the server's autovacuum may be off, and the
// rows were just inserted) must not stall the start: the first claim fills
// the poll batch and the first request goes out within one poll interval.
func TestFirstSendOnAFreshTableWithinOnePollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, topic := range []string{"EVENT", "DISPATCH_JOB"} {
		// 2,500 rows in 50 groups, by plain SQL, as an application would.
		b.exec(t, `INSERT INTO `+b.table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
SELECT 'R' || i, $1, 'group-' || (i % 50), '{"n":' || i || '}', 'PENDING', 0, now() - interval '1 hour' + i * interval '1 millisecond'
FROM generate_series(1, 2500) AS i`, topic)
	}
	// The reference: seed 004's own fetch-and-lock of 500 rows on the same
	// table, rolled back. It scales the allowance with the machine's load.
	ref := time.Now()
	tx, err := b.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`WITH selected AS (
    SELECT id FROM ` + b.table("EVENT") + ` WHERE status = 'PENDING'
    ORDER BY message_group, created_at LIMIT 500 FOR UPDATE SKIP LOCKED)
UPDATE ` + b.table("EVENT") + ` t SET status = 'PROCESSING', processed_at = NOW()
FROM selected s WHERE t.id = s.id RETURNING t.*`); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	seedClaim := time.Since(ref)

	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	cs := &countingStore{Store: b.store}
	var once sync.Once
	first := make(chan int64, 1)
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		once.Do(func() { first <- cs.claims.Load() })
		return nil
	})
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.PollInterval = time.Second
	cfg.PollBatchSize, cfg.PublishBatchSize, cfg.BufferSize = 500, 100, 1000
	p, err := outbox.NewProcessor(cs, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case n := <-first:
		if got := cs.first.Load(); n < 1 || got != int64(cfg.PollBatchSize) {
			t.Errorf("the first claim returned %d rows, want a full poll batch (%d)", got, cfg.PollBatchSize)
		}
		if d, allowed := time.Since(start), cfg.PollInterval+10*seedClaim; d > allowed {
			t.Errorf("the first request went out %s after the start, more than one poll interval (%s) plus 10 times the seed's own claim (%s)", d, cfg.PollInterval, seedClaim)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no request within 60 s of the start")
	}
	waitFor(t, "every row COMPLETED", 60*time.Second, func() bool { return b.countStatus(t, "COMPLETED") == 5000 })
}

// The same on MongoDB: 2,500 documents in 50 groups in each collection,
// written by insertMany; the first request goes out within one poll
// interval plus ten of the seed's own one-document fetch-and-lock
// (findOneAndUpdate sorted by messageGroup, createdAt) on the same
// collection, the seed's processor making 500 of those before its first
// send. The allowance scales with the server's speed: FerretDB scans the
// collection for every command.
func TestMongoFirstSendOnAFreshCollectionWithinOnePollInterval(t *testing.T) {
	t.Parallel()
	b := setupMongo(t)
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
	cfg := fastConfig()
	cfg.PollInterval = time.Second
	cfg.PollBatchSize, cfg.PublishBatchSize, cfg.BufferSize = 500, 100, 1000
	p, err := outbox.NewProcessor(b.store, pub, cfg)
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
