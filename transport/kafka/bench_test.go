package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/transport/kafka"
)

// BenchmarkPublish compares the Publisher, in waves (a group's next record
// waits for the previous one's ack) and pipelined (Config.Pipeline: every
// record at once, FIFO per group kept by the idempotent producer), with
// franz-go producing the same records directly (all at once, then waiting
// for every ack), alternating batch by batch in the same run against the
// same in-process kfake cluster. It reports the three rates and the two
// ratios to the direct rate.
//
// Shapes: "mixed" hands one Publish call a batch of many groups (100 groups
// x 10 messages); "processor" calls Publish from 10 goroutines at once, each
// with 100 messages of one group, as the processor does with its default
// MaxConcurrentGroups and PublishBatchSize.
//
//	go test -run '^$' -bench Publish -benchtime 200x ./transport/kafka/
func BenchmarkPublish(b *testing.B) {
	for _, linger := range []time.Duration{0, 10 * time.Millisecond} {
		for _, shape := range []struct {
			name           string
			callers        int
			groups, perGrp int
			unordered      bool
		}{
			{"unordered", 1, 1000, 1, true},
			{"wide", 1, 1000, 1, false},
			{"mixed", 1, 100, 10, false},
			{"processor", 10, 1, 100, false},
			{"processor-100-groups", 100, 1, 10, false},
		} {
			b.Run(fmt.Sprintf("linger=%s/%s", linger, shape.name), func(b *testing.B) {
				c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "bench"))
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(linger))
				if err != nil {
					b.Fatal(err)
				}
				defer cl.Close()
				pub, err := kafka.New(kafka.Config{Client: cl})
				if err != nil {
					b.Fatal(err)
				}
				piped, err := kafka.New(kafka.Config{Client: cl, Pipeline: true})
				if err != nil {
					b.Fatal(err)
				}
				// One batch per caller, distinct groups per caller.
				batches := make([][]outbox.Message, shape.callers)
				for k := range batches {
					for j := range shape.perGrp {
						for g := range shape.groups {
							group := fmt.Sprintf("g-%d-%d", k, g)
							if shape.unordered {
								group = ""
							}
							batches[k] = append(batches[k], outbox.Message{
								ID: fmt.Sprintf("%d-%d-%d", k, g, j), Topic: "bench", Group: group,
								Seq: int64(j), Payload: []byte(`{"order":"o-1","type":"OrderCreated","amount":1234}`),
								Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
							})
						}
					}
				}
				perIter := shape.callers * shape.groups * shape.perGrp
				ctx := context.Background()
				direct := func(msgs []outbox.Message) {
					var wg sync.WaitGroup
					wg.Add(len(msgs))
					for i := range msgs {
						m := &msgs[i]
						r := &kgo.Record{Topic: "bench", Value: m.Payload, Headers: []kgo.RecordHeader{
							{Key: "traceparent", Value: []byte(m.Headers["traceparent"])}, {Key: kafka.HeaderID, Value: []byte(m.ID)},
							{Key: kafka.HeaderTopic, Value: []byte(m.Topic)}, {Key: kafka.HeaderGroup, Value: []byte(m.Group)},
							{Key: kafka.HeaderSeq, Value: []byte("1")}, {Key: kafka.HeaderContentType, Value: []byte("application/json")},
						}}
						if m.Group != "" {
							r.Key = []byte(m.Group)
						}
						cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
							if err != nil {
								b.Error(err)
							}
							wg.Done()
						})
					}
					wg.Wait()
				}
				via := func(p *kafka.Publisher) func([]outbox.Message) {
					return func(msgs []outbox.Message) {
						for _, r := range p.Publish(ctx, msgs) {
							if r.Err != nil {
								b.Error(r.Err)
							}
						}
					}
				}
				viaPublisher, viaPipeline := via(pub), via(piped)
				timed := func(fn func([]outbox.Message)) time.Duration {
					start := time.Now()
					var wg sync.WaitGroup
					for k := range batches {
						wg.Go(func() { fn(batches[k]) })
					}
					wg.Wait()
					return time.Since(start)
				}
				timed(direct) // warm up: metadata, producer ID, connections
				timed(viaPublisher)
				timed(viaPipeline)
				var dDirect, dPub, dPipe time.Duration
				b.ResetTimer()
				for b.Loop() {
					dDirect += timed(direct)
					dPub += timed(viaPublisher)
					dPipe += timed(viaPipeline)
				}
				n := float64(b.N * perIter)
				directRate, pubRate, pipeRate := n/dDirect.Seconds(), n/dPub.Seconds(), n/dPipe.Seconds()
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(directRate, "direct-msgs/s")
				b.ReportMetric(pubRate, "waves-msgs/s")
				b.ReportMetric(pipeRate, "pipelined-msgs/s")
				b.ReportMetric(pubRate/directRate, "waves-ratio")
				b.ReportMetric(pipeRate/directRate, "pipelined-ratio")
				if v := piped.OrderViolations(); v != 0 {
					b.Fatalf("%d order violations", v)
				}
			})
		}
	}
}
