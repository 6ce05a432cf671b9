package mongo_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	mongodriver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// commandCounter counts the commands a client sends, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounter) started(_ context.Context, e *event.CommandStartedEvent) {
	c.mu.Lock()
	c.n[e.CommandName]++
	c.mu.Unlock()
}

// take returns the counts since the last take and their total.
func (c *commandCounter) take() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := c.n, 0
	for _, n := range out {
		total += n
	}
	c.n = map[string]int{}
	return out, total
}

// sum adds up counts by name, as "name n, ...".
func sum(counts []map[string]int) string {
	m := map[string]int{}
	for _, c := range counts {
		for k, v := range c {
			m[k] += v
		}
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// The work per document on MongoDB does not depend on the machine's load:
// claiming 1,000 documents in 10 groups of 100 and recording them as sent
// (100 outcomes per finish, as one request of api-batch-size 100 reports
// them) takes a bounded number of commands (round trips) per document.
// FerretDB runs each command as a scan of the collection, so these counts
// are what its throughput is made of; on MongoDB they are its latency.
func TestRoundTripsPerDocument(t *testing.T) {
	t.Parallel()
	m := testbackend.Mongo(t)
	counter := &commandCounter{n: map[string]int{}}
	client, err := mongodriver.Connect(options.Client().ApplyURI(testbackend.MongoURI(t)).SetMaxPoolSize(4).
		SetTimeout(20 * time.Second).SetMonitor(&event.CommandMonitor{Started: counter.started}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(m.DB.Name())
	st, err := mongo.New(db, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// No time budget: the counts do not depend on the server's speed.
	mongo.SetClaimBudget(st, time.Hour)
	ctx := context.Background()
	if err := st.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	const docs, groups = 1000, 10
	var batch []any
	t0 := time.Now().UTC().Add(-time.Hour)
	for i := 1; i <= docs; i++ {
		batch = append(batch, bson.D{{Key: "_id", Value: fmt.Sprintf("R%06d", i)}, {Key: "type", Value: "EVENT"},
			{Key: "messageGroup", Value: fmt.Sprint("group-", i%groups)}, {Key: "payload", Value: `{"n":1}`},
			{Key: "status", Value: "PENDING"}, {Key: "retryCount", Value: 0},
			{Key: "createdAt", Value: t0.Add(time.Duration(i) * time.Millisecond)}})
	}
	if _, err := m.DB.Collection(mongo.DefaultEventsTable).InsertMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	counter.take()

	// The processor's cycle: a claim of 500 (the seed's poll-batch-size),
	// then the outcomes of what it leased, 100 per finish, until every
	// document is COMPLETED (a group in flight waits, so this takes two
	// claims or more).
	var claimCmds, finishCmds []map[string]int
	claimTotal, finishTotal, claims, finishes, leased := 0, 0, 0, 0, 0
	for leased < docs && claims < 400 {
		msgs, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		claims++
		leased += len(msgs)
		c, n := counter.take()
		claimCmds, claimTotal = append(claimCmds, c), claimTotal+n
		for start := 0; start < len(msgs); start += 100 {
			var outcomes []outbox.Outcome
			for _, msg := range msgs[start:min(start+100, len(msgs))] {
				outcomes = append(outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: msg.Topic, ID: msg.ID, Attempt: msg.Attempts, ClaimToken: msg.ClaimToken})
			}
			res, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: outcomes})
			if err != nil || len(res.LeaseLost) > 0 {
				t.Fatalf("finish: %v, %d leases lost", err, len(res.LeaseLost))
			}
			finishes++
		}
		c, n = counter.take()
		finishCmds, finishTotal = append(finishCmds, c), finishTotal+n
	}
	if leased != docs {
		t.Fatalf("%d claims leased %d documents, want %d (%d commands)", claims, leased, docs, claimTotal)
	}
	n, err := m.DB.Collection(mongo.DefaultEventsTable).CountDocuments(ctx, bson.D{{Key: "status", Value: "COMPLETED"}})
	if err != nil || n != docs {
		t.Fatalf("%d documents COMPLETED (%v), want %d", n, err, docs)
	}
	t.Logf("claim: %d commands in %d claims for %d documents (%.3f per document): %v", claimTotal, claims, docs, float64(claimTotal)/docs, sum(claimCmds))
	t.Logf("finish: %d commands in %d finishes (%.3f per document): %v", finishTotal, finishes, float64(finishTotal)/docs, sum(finishCmds))
	// The bounds: a claim reads the server's clock, the groups of each
	// collection (one command while they fit in its window), locks and
	// unlocks them in batches, then per group one read and one update of
	// its run; a finish of 100 sent outcomes reads the clock and makes one
	// update; the Store's first claim hands out its first 8 documents at
	// once, which costs a claim and a finish more. (Before this shape: 0.077 and 0.030 without a time budget;
	// 0.654 and 0.129 with it on a busy FerretDB, whose claims it cut after
	// a group or two.)
	if per := float64(claimTotal) / docs; per > 0.04 {
		t.Errorf("claiming took %.3f commands per document, want at most 0.04", per)
	}
	if per := float64(finishTotal) / docs; per > 0.025 {
		t.Errorf("finishing took %.3f commands per document, want at most 0.025", per)
	}
}
