package postgres_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
)

// BenchmarkThroughput measures the processor end to end on PostgreSQL:
// 10,000 rows in 100 groups written by plain SQL, sent to the fake
// FlowCatalyst over HTTP with api-batch-size 100 (seed 004's defaults
// otherwise), with and without 20% of requests failing with 503. It reports
// rows/s; BenchmarkFakeServerCapacity reports the fake server's own limit.
//
//	go test -run '^$' -bench Throughput -benchtime 1x ./flowcatalyst/seedstore/postgres/
func BenchmarkThroughput(b *testing.B) {
	for _, failPct := range []int{0, 20} {
		b.Run(fmt.Sprintf("db=PostgreSQL/503s=%d%%", failPct), func(b *testing.B) {
			for range b.N {
				b.ReportMetric(seedtest.ThroughputRun(b, setup, failPct), "rows/s")
			}
		})
	}
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
