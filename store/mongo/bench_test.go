package mongo_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// commandCounter counts the commands a client sends, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		c.n[e.CommandName]++
		c.mu.Unlock()
	}}
}

func (c *commandCounter) reset() {
	c.mu.Lock()
	c.n = map[string]int{}
	c.mu.Unlock()
}

// report returns the total and a per-command breakdown, per message.
func (c *commandCounter) report(msgs int) (float64, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	var parts []string
	for name, n := range c.n {
		total += n
		parts = append(parts, fmt.Sprintf("%s %.3f", name, float64(n)/float64(msgs)))
	}
	sort.Strings(parts)
	return float64(total) / float64(msgs), strings.Join(parts, ", ")
}

// BenchmarkClaimFinishRoundTrips drains 2,000 messages in 100 groups by
// hand, as a processor would but without its idle polls: claims of up to
// 500 messages, each claim's messages finished SENT (with a provider ID)
// in batches of 100. It reports the round trips (commands sent to the
// server) per message, a figure that does not move with the machine's
// load; the drain rate does:
//
//	go test -run '^$' -bench ClaimFinishRoundTrips -benchtime 1x ./store/mongo
func BenchmarkClaimFinishRoundTrips(b *testing.B) {
	const n, groups = 2000, 100
	for range b.N {
		b.StopTimer()
		direct := benchBacklog(b, n, groups)
		ctx := context.Background()
		claims, finishes := &commandCounter{n: map[string]int{}}, &commandCounter{n: map[string]int{}}
		var cur *commandCounter
		client, err := mongodrv.Connect(options.Client().ApplyURI(testbackend.MongoURI(b)).SetTimeout(60 * time.Second).
			SetMonitor(&event.CommandMonitor{Started: func(ctx context.Context, e *event.CommandStartedEvent) { cur.monitor().Started(ctx, e) }}))
		if err != nil {
			b.Fatal(err)
		}
		s, err := mongo.New(client.Database(direct.Database().Name()), mongo.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		done := 0
		for done < n {
			cur = claims
			got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "o", Now: time.Now()})
			if err != nil {
				b.Fatal(err)
			}
			if len(got) == 0 {
				b.Fatalf("nothing claimed with %d of %d messages done", done, n)
			}
			cur = finishes
			for from := 0; from < len(got); from += 100 {
				var outs []outbox.Outcome
				for _, m := range got[from:min(from+100, len(got))] {
					outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "p-" + m.ID})
				}
				res, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "o", Now: time.Now(), Outcomes: outs})
				if err != nil || len(res.LeaseLost) > 0 {
					b.Fatalf("finish: %d lost, %v", len(res.LeaseLost), err)
				}
			}
			done += len(got)
		}
		took := time.Since(start)
		b.StopTimer()
		c, cd := claims.report(n)
		f, fd := finishes.report(n)
		b.ReportMetric(c+f, "roundtrips/msg")
		b.ReportMetric(c, "claim-roundtrips/msg")
		b.ReportMetric(f, "finish-roundtrips/msg")
		b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
		b.Logf("claims: %s; finishes: %s", cd, fd)
		_ = client.Disconnect(ctx)
	}
}

// BenchmarkDrainRoundTrips drains 2,000 messages in 100 groups with one
// processor (default settings but a poll interval of 50 ms, a publisher
// that always succeeds) and reports the drain rate and the commands sent
// per message, idle polls included (their number grows with the drain's
// time, so with the machine's load):
//
//	go test -run '^$' -bench DrainRoundTrips -benchtime 1x ./store/mongo
func BenchmarkDrainRoundTrips(b *testing.B) {
	const n, groups = 2000, 100
	for range b.N {
		b.StopTimer()
		direct := benchBacklog(b, n, groups)
		ctx := context.Background()
		counter := &commandCounter{n: map[string]int{}}
		client, err := mongodrv.Connect(options.Client().ApplyURI(testbackend.MongoURI(b)).
			SetMaxPoolSize(4).SetTimeout(60 * time.Second).SetMonitor(counter.monitor()))
		if err != nil {
			b.Fatal(err)
		}
		s, err := mongo.New(client.Database(direct.Database().Name()), mongo.Options{})
		if err != nil {
			b.Fatal(err)
		}
		p, err := outbox.NewProcessor(s, outbox.PublisherFunc(func(_ context.Context, batch []outbox.Message) []outbox.Result {
			out := make([]outbox.Result, len(batch))
			for i, m := range batch {
				out[i] = outbox.Result{ProviderMessageID: "p-" + m.ID}
			}
			return out
		}), outbox.Config{AllTopics: true, PollInterval: 50 * time.Millisecond, RecoveryInterval: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		counter.reset()
		b.StartTimer()
		start := time.Now()
		go func() { done <- p.Run(runCtx) }()
		for {
			c, err := direct.MessageCount(ctx, outbox.MessageCountParams{})
			if err != nil {
				b.Fatal(err)
			}
			if c[outbox.StatusSent] == n {
				break
			}
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("not drained after 10 minutes: %v", c)
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		per, detail := counter.report(n)
		b.ReportMetric(per, "commands/msg")
		b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
		b.Logf("round trips per message: %s", detail)
		_ = client.Disconnect(ctx)
	}
}

// benchBacklog returns a fresh store holding n messages of topic "t" in
// groups groups, enqueued 500 at a time.
func benchBacklog(b *testing.B, n, groups int) *mongo.Store {
	b.Helper()
	direct, _ := newStore(b, mongo.Options{})
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "t", Group: fmt.Sprint("g", i%groups), Payload: []byte(fmt.Sprint(i))})
	}
	for start := 0; start < n; start += 500 {
		if _, err := outbox.New(direct, outbox.Options{}).Enqueue(context.Background(), msgs[start:min(start+500, n)]...); err != nil {
			b.Fatal(err)
		}
	}
	return direct
}
