package seedstore_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// BenchmarkThroughput measures the processor end to end on PostgreSQL:
// 10,000 rows in 100 groups written by plain SQL, sent to the fake
// FlowCatalyst over HTTP with api-batch-size 100 (seed 004's defaults
// otherwise), with and without 20% of requests failing with 503. It reports
// rows/s; BenchmarkFakeServerCapacity reports the fake server's own limit.
//
//	go test -run '^$' -bench Throughput -benchtime 1x ./flowcatalyst/seedstore/
func BenchmarkThroughput(b *testing.B) {
	for _, db := range []struct {
		name  string
		setup func(testing.TB) *bundle
	}{{"PostgreSQL", setup}, {"MySQL", setupMySQL}} {
		for _, failPct := range []int{0, 20} {
			b.Run(fmt.Sprintf("db=%s/503s=%d%%", db.name, failPct), func(b *testing.B) {
				for range b.N {
					rate := throughputRun(b, db.setup, failPct)
					b.ReportMetric(rate, "rows/s")
				}
			})
		}
	}
}

func throughputRun(b *testing.B, setup func(testing.TB) *bundle, failPct int) float64 {
	bd := setup(b)
	const rows, groups = 10000, 100
	if bd.mysql {
		// Rows by plain SQL, a second apart (TIMESTAMP has whole seconds).
		for from := 1; from <= rows; from += 1000 {
			var vals []string
			var args []any
			for i := from; i < from+1000 && i <= rows; i++ {
				vals = append(vals, `(?, 'EVENT', ?, ?, 'PENDING', 0, NOW() - INTERVAL 1 DAY + INTERVAL ? SECOND)`)
				args = append(args, fmt.Sprintf("R%06d", i), fmt.Sprint("group-", i%groups),
					fmt.Sprintf(`{"type":"order.created","source":"bench","data":{"n":%d}}`, i), i)
			}
			if _, err := bd.db.Exec(`INSERT INTO `+bd.table("EVENT")+` (id, type, message_group, payload, status, retry_count, created_at) VALUES `+
				strings.Join(vals, ", "), args...); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		bd.exec(b, `INSERT INTO `+bd.table("EVENT")+` (id, type, message_group, payload, status, retry_count, created_at)
SELECT 'R' || i, 'EVENT', 'group-' || (i % $1), '{"type":"order.created","source":"bench","data":{"n":' || i || '}}', 'PENDING', 0,
	now() - interval '1 hour' + i * interval '1 millisecond'
FROM generate_series(1, $2) AS i`, groups, rows)
	}
	left := func() int {
		var left int
		if err := bd.db.QueryRow(`SELECT count(*) FROM ` + bd.table("EVENT") + ` WHERE status <> 'COMPLETED'`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		return left
	}
	return runThroughput(b, bd.store, failPct, rows, left)
}

// runThroughput runs one processor over st until left reports 0 and
// returns rows/s.
func runThroughput(b *testing.B, st *seedstore.Store, failPct, rows int, left func() int) float64 {
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	var n atomic.Int64
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		if failPct > 0 && int(n.Add(1)%100) < failPct {
			return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"injected"}`)}
		}
		return nil
	})
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 100, ChargeEveryItem: true})
	if err != nil {
		b.Fatal(err)
	}
	cfg := outbox.Config{
		PollInterval: time.Second, PollBatchSize: 500, PublishBatchSize: 100, MaxConcurrentGroups: 10, BufferSize: 1000,
		ProcessingTimeout: 5 * time.Minute, RecoveryInterval: time.Minute, DrainTimeout: 5 * time.Second,
		MaxAttempts: 20, Backoff: outbox.Backoff{Schedule: []time.Duration{10 * time.Millisecond}},
	}
	ts := &timedStore{Store: st}
	p, err := outbox.NewProcessor(ts, pub, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		remaining := left()
		if remaining == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d rows not COMPLETED after 5 minutes", remaining)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cancel()
	<-done
	b.ReportMetric(float64(ts.claimNs.Load())/1e6/float64(max(ts.claims.Load(), 1)), "ms/claim")
	b.ReportMetric(float64(ts.claims.Load()), "claims")
	b.ReportMetric(float64(ts.finishNs.Load())/1e6/float64(max(ts.finishes.Load(), 1)), "ms/finish")
	return float64(rows) / elapsed.Seconds()
}

// timedStore adds up the time spent claiming and finishing.
type timedStore struct {
	*seedstore.Store
	claims, claimNs, finishes, finishNs atomic.Int64
}

func (s *timedStore) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	t := time.Now()
	defer func() { s.claims.Add(1); s.claimNs.Add(int64(time.Since(t))) }()
	return s.Store.MessageClaim(ctx, p)
}

func (s *timedStore) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	t := time.Now()
	defer func() { s.finishes.Add(1); s.finishNs.Add(int64(time.Since(t))) }()
	return s.Store.MessageFinish(ctx, p)
}

// BenchmarkFakeServerCapacity measures the fake FlowCatalyst alone: 10
// concurrent clients posting 100-item requests; items/s.
func BenchmarkFakeServerCapacity(b *testing.B) {
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	var items []string
	for i := range 100 {
		items = append(items, fmt.Sprintf(`{"type":"order.created","source":"bench","data":{"n":%d}}`, i))
	}
	body := []byte(`{"items":[` + strings.Join(items, ",") + `]}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 10}}
	const total = 200
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= total {
					resp, err := client.Post(srv.URL+flowcatalyst.CurrentAPI.EventsPath, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode >= 300 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(total*100)/time.Since(start).Seconds(), "items/s")
	}
}

// BenchmarkThroughputMongo is BenchmarkThroughput on seed 004's collections
// in the test MongoDB server (FerretDB here): 10,000 documents in 100
// groups written by plain insertMany, the same processor settings and fake
// server.
//
//	go test -run '^$' -bench ThroughputMongo -benchtime 1x ./flowcatalyst/seedstore/
func BenchmarkThroughputMongo(b *testing.B) {
	for _, failPct := range []int{0, 20} {
		b.Run(fmt.Sprintf("db=MongoDB/503s=%d%%", failPct), func(b *testing.B) {
			for range b.N {
				m := testbackend.Mongo(b)
				st, err := seedstore.NewMongo(m.DB, seedstore.Options{})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if err := st.CreateTables(ctx); err != nil {
					b.Fatal(err)
				}
				coll := m.DB.Collection(seedstore.DefaultEventsTable)
				const rows, groups = 10000, 100
				t0 := time.Now().Add(-time.Hour)
				for from := 1; from <= rows; from += 1000 {
					var docs []any
					for i := from; i < from+1000 && i <= rows; i++ {
						docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("R%06d", i)}, {Key: "type", Value: "EVENT"},
							{Key: "messageGroup", Value: fmt.Sprint("group-", i%groups)},
							{Key: "payload", Value: fmt.Sprintf(`{"type":"order.created","source":"bench","data":{"n":%d}}`, i)},
							{Key: "status", Value: "PENDING"}, {Key: "retryCount", Value: 0},
							{Key: "createdAt", Value: t0.Add(time.Duration(i) * time.Millisecond)}})
					}
					if _, err := coll.InsertMany(ctx, docs); err != nil {
						b.Fatal(err)
					}
				}
				left := func() int {
					n, err := coll.CountDocuments(ctx, bson.D{{Key: "status", Value: bson.D{{Key: "$ne", Value: "COMPLETED"}}}})
					if err != nil {
						b.Fatal(err)
					}
					return int(n)
				}
				b.ReportMetric(runThroughput(b, st, failPct, rows, left), "rows/s")
			}
		})
	}
}
