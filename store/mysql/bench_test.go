package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// BenchmarkEnqueueTx measures enqueueing in the caller's transaction
// (begin, enqueue, commit) per message, with 1 and 100 messages per
// transaction (one group, and 100 groups), from parallel clients.
func BenchmarkEnqueueTx(b *testing.B) {
	for _, c := range []struct {
		name        string
		per, groups int
	}{{"per_tx=1", 1, 1}, {"per_tx=100", 100, 1}, {"per_tx=100/groups=100", 100, 100}} {
		b.Run(c.name, func(b *testing.B) {
			st, d := newStore(b, mysql.Options{})
			ob := outbox.New[*sql.Tx](st, outbox.Options{})
			ctx := context.Background()
			payload := []byte(`{"type":"order.updated","data":{"customer":"c-000042","currency":"EUR","note":"` + fmt.Sprintf("%0120d", 0) + `"}}`)
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				msgs := make([]outbox.Message, c.per)
				i := 0
				for pb.Next() {
					for j := range msgs {
						msgs[j] = outbox.Message{Topic: "bench", Group: fmt.Sprintf("g%d", (i+j%c.groups)%1000), Payload: payload}
					}
					i++
					tx, err := d.DB.BeginTx(ctx, nil)
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := ob.EnqueueTx(ctx, tx, msgs...); err != nil {
						_ = tx.Rollback()
						b.Error(err)
						return
					}
					if err := tx.Commit(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N*c.per)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
