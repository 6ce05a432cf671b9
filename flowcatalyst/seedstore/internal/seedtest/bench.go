package seedtest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/outbox"
)

// ThroughputRun measures a processor over 10,000 rows in 100 groups,
// written by plain SQL into a fresh Bundle, with failPct per cent of requests
// failing; rows/s.
func ThroughputRun(b *testing.B, setup func(testing.TB) *Bundle, failPct int) float64 {
	bd := setup(b)
	const rows, groups = 10000, 100
	if bd.MySQL {
		// Rows by plain SQL, a second apart (TIMESTAMP has whole seconds).
		for from := 1; from <= rows; from += 1000 {
			var vals []string
			var args []any
			for i := from; i < from+1000 && i <= rows; i++ {
				vals = append(vals, `(?, 'EVENT', ?, ?, 'PENDING', 0, NOW() - INTERVAL 1 DAY + INTERVAL ? SECOND)`)
				args = append(args, fmt.Sprintf("R%06d", i), fmt.Sprint("group-", i%groups),
					fmt.Sprintf(`{"type":"order.created","source":"bench","data":{"n":%d}}`, i), i)
			}
			if _, err := bd.DB.Exec(`INSERT INTO `+bd.Table("EVENT")+` (id, type, message_group, payload, status, retry_count, created_at) VALUES `+
				strings.Join(vals, ", "), args...); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		bd.Exec(b, `INSERT INTO `+bd.Table("EVENT")+` (id, type, message_group, payload, status, retry_count, created_at)
SELECT 'R' || i, 'EVENT', 'group-' || (i % $1), '{"type":"order.created","source":"bench","data":{"n":' || i || '}}', 'PENDING', 0,
	now() - interval '1 hour' + i * interval '1 millisecond'
FROM generate_series(1, $2) AS i`, groups, rows)
	}
	left := func() int {
		var left int
		if err := bd.DB.QueryRow(`SELECT count(*) FROM ` + bd.Table("EVENT") + ` WHERE status <> 'COMPLETED'`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		return left
	}
	return RunThroughput(b, bd.Store, failPct, rows, left)
}

// RunThroughput runs one processor over st until left reports 0 and
// returns rows/s.
func RunThroughput(b *testing.B, st Store, failPct, rows int, left func() int) float64 {
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
	Store
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
