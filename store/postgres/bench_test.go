package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// benchStore returns a migrated store in a fresh schema for b.
func benchStore(b *testing.B) (*postgres.Store, testbackend.PostgresSchema) {
	b.Helper()
	pg := testbackend.Postgres(b, 16)
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s, pg
}

func benchPayload(n int) []byte {
	return fmt.Appendf(nil, `{"n":%d,"type":"order.updated","data":{"customer":"c-%06d","currency":"EUR","note":"%0120d"}}`, n, n, 0)
}

// BenchmarkEnqueueTx measures enqueueing in the caller's transaction
// (begin, enqueue, commit), per message, with 1 and 100 messages per
// transaction, from parallel clients.
func BenchmarkEnqueueTx(b *testing.B) {
	for _, per := range []int{1, 100} {
		b.Run(fmt.Sprintf("per_tx=%d", per), func(b *testing.B) {
			s, pg := benchStore(b)
			ob := outbox.New[pgx.Tx](s, outbox.Options{})
			ctx := context.Background()
			b.SetParallelism(4) // 4 x GOMAXPROCS clients
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				msgs := make([]outbox.Message, per)
				i := 0
				for pb.Next() {
					g := fmt.Sprintf("g%d", i%1000)
					for j := range msgs {
						msgs[j] = outbox.Message{Topic: "bench", Group: g, Payload: benchPayload(i)}
					}
					i++
					tx, err := pg.Pool.Begin(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := ob.EnqueueTx(ctx, tx, msgs...); err != nil {
						_ = tx.Rollback(ctx)
						b.Error(err)
						return
					}
					if err := tx.Commit(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkClaimFinish measures the processor's store calls: claim 500
// messages from a backlog of 1,000 groups, then record them as sent, per
// message.
func BenchmarkClaimFinish(b *testing.B) {
	s, pg := benchStore(b)
	ctx := context.Background()
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	const batch = 500
	fill := func(n int) {
		for start := 0; start < n; start += 1000 {
			msgs := make([]outbox.Message, 0, 1000)
			for i := start; i < min(start+1000, n); i++ {
				msgs = append(msgs, outbox.Message{Topic: "bench", Group: fmt.Sprintf("g%d", i%1000), Payload: benchPayload(i)})
			}
			if _, err := ob.Enqueue(ctx, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := pg.Pool.Exec(ctx, "VACUUM ANALYZE "+s.MessagesTable()); err != nil {
			b.Fatal(err)
		}
	}
	fill(max(b.N, batch) + batch)
	b.ResetTimer()
	done := 0
	var claiming, finishing time.Duration
	for done < b.N {
		t0 := time.Now()
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: batch, Owner: "bench", Now: time.Now()})
		claiming += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if len(ms) == 0 {
			b.Fatal("backlog exhausted")
		}
		p := outbox.MessageFinishParams{Owner: "bench", Now: time.Now()}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "p-" + m.ID, StartedAt: time.Now()})
		}
		t0 = time.Now()
		if _, err := s.MessageFinish(ctx, p); err != nil {
			b.Fatal(err)
		}
		finishing += time.Since(t0)
		done += len(ms)
	}
	b.StopTimer()
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(claiming.Microseconds())/float64(done), "claim-µs/msg")
	b.ReportMetric(float64(finishing.Microseconds())/float64(done), "finish-µs/msg")
}
