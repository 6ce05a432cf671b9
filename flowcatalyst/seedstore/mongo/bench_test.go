package mongo_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// BenchmarkThroughput is BenchmarkThroughput on seed 004's collections
// in the test MongoDB server (FerretDB here): 10,000 documents in 100
// groups written by plain insertMany, the same processor settings and fake
// server.
//
//	go test -run '^$' -bench Throughput -benchtime 1x ./flowcatalyst/seedstore/mongo/
func BenchmarkThroughput(b *testing.B) {
	for _, failPct := range []int{0, 20} {
		b.Run(fmt.Sprintf("db=MongoDB/503s=%d%%", failPct), func(b *testing.B) {
			for range b.N {
				m := testbackend.Mongo(b)
				st, err := mongo.New(m.DB, mongo.Options{})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if err := st.CreateTables(ctx); err != nil {
					b.Fatal(err)
				}
				coll := m.DB.Collection(mongo.DefaultEventsTable)
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
				b.ReportMetric(seedtest.RunThroughput(b, st, failPct, rows, left), "rows/s")
			}
		})
	}
}
