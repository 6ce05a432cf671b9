package mysql_test

import (
	"fmt"
	"testing"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
)

// BenchmarkThroughput measures the processor end to end on MySQL/MariaDB:
// 10,000 rows in 100 groups written by plain SQL, sent to the fake
// FlowCatalyst over HTTP with api-batch-size 100 (seed 004's defaults
// otherwise), with and without 20% of requests failing with 503; rows/s.
//
//	go test -run '^$' -bench Throughput -benchtime 1x ./flowcatalyst/seedstore/mysql/
func BenchmarkThroughput(b *testing.B) {
	for _, failPct := range []int{0, 20} {
		b.Run(fmt.Sprintf("db=MySQL/503s=%d%%", failPct), func(b *testing.B) {
			for range b.N {
				b.ReportMetric(seedtest.ThroughputRun(b, setup, failPct), "rows/s")
			}
		})
	}
}
