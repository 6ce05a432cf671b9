package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/transport/kafka"
)

// Pipelined, deep groups go out at once and land in group order.
func TestPipelinedKeepsGroupOrder(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c, kgo.ProducerLinger(0)), Pipeline: true, MaxInFlight: 7})
	msgs := batch("orders", 5, 20, 3)
	for i, r := range pub.Publish(context.Background(), msgs) {
		if r.Err != nil || !strings.HasPrefix(r.ProviderMessageID, "orders/") {
			t.Fatalf("%s: %v %q", msgs[i].ID, r.Err, r.ProviderMessageID)
		}
	}
	byGroup := checkOrder(t, readAll(t, c, len(msgs), "orders"))
	for g, seqs := range byGroup {
		if len(seqs) != 20 {
			t.Fatalf("group %s: %v", g, seqs)
		}
	}
	if n := pub.OrderViolations(); n != 0 {
		t.Fatalf("%d order violations", n)
	}
}

// A broker error on a batch in the middle of a group: the group's records
// before the batch are sent, the batch's first record gets the error, every
// later record of the group is not attempted (franz-go failed them with the
// partition's buffer), and the other group is untouched. Publishing the rest
// again completes both groups in order.
func TestPipelinedBrokerErrorMidGroup(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 2} { // 2: records wait for room, and for their group
		t.Run(fmt.Sprintf("MaxInFlight=%d", n), func(t *testing.T) {
			t.Parallel()
			testPipelinedBrokerErrorMidGroup(t, n)
		})
	}
}

func testPipelinedBrokerErrorMidGroup(t *testing.T, maxInFlight int) {
	c := newCluster(t, kfake.NumBrokers(2), kfake.SeedTopics(1, "t-ga", "t-gb"))
	if err := c.MoveTopicPartition("t-ga", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveTopicPartition("t-gb", 0, 1); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		failedAt = int32(-1) // the producer sequence of the first record of the failed batch (= its index in group b)
		failing  atomic.Bool
	)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		hit := false
		for _, rt := range preq.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(rp.Records); err != nil {
					return nil, nil, false
				}
				// Fail the batch of group b that holds its fifth record
				// (sequence 4), once.
				if c.CurrentNode() == 1 && rb.FirstSequence <= 4 && 4 < rb.FirstSequence+rb.NumRecords && !failing.Swap(true) {
					mu.Lock()
					failedAt = rb.FirstSequence
					mu.Unlock()
					hit = true
				}
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.PolicyViolation.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		if !hit {
			return nil, nil, false
		}
		return resp, nil, true
	})
	pub := newPublisher(t, kafka.Config{
		// Small batches (2 or 3 records): the failed batch has batches of
		// the group before it and behind it.
		Client:      newClient(t, c, kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(512)),
		Topic:       func(m *outbox.Message) (string, error) { return "t-" + m.Group, nil },
		Pipeline:    true,
		MaxInFlight: maxInFlight,
	})
	msgs := batch("orders", 2, 8, 0) // a0 b0 a1 b1 ... a7 b7
	res := pub.Publish(context.Background(), msgs)
	mu.Lock()
	f := int(failedAt)
	mu.Unlock()
	if f < 1 {
		t.Fatalf("the failed batch of group b starts at its record %d, want a batch in the middle of the group", f)
	}
	t.Logf("group b failed at its record %d", f)
	k := 0 // position in group b
	for i, r := range res {
		m := msgs[i]
		if m.Group == "ga" {
			if r.Err != nil {
				t.Errorf("%s: %v", m.ID, r.Err)
			}
			continue
		}
		switch {
		case k < f:
			if r.Err != nil {
				t.Errorf("%s (before the failed batch at %d): %v", m.ID, f, r.Err)
			}
		case k == f:
			var pe *outbox.PublishError
			if !errors.As(r.Err, &pe) || pe.Permanent || pe.Code != "kafka_44" || errors.Is(r.Err, outbox.ErrNotAttempted) {
				t.Errorf("%s: %v, want a retryable kafka_44 (POLICY_VIOLATION)", m.ID, r.Err)
			}
		default:
			if !errors.Is(r.Err, outbox.ErrNotAttempted) {
				t.Errorf("%s: %v, want ErrNotAttempted (an earlier message of the group failed)", m.ID, r.Err)
			}
		}
		k++
	}
	if n := pub.OrderViolations(); n != 0 {
		t.Fatalf("%d order violations", n)
	}
	var rest []outbox.Message
	for i := range msgs {
		if res[i].Err != nil {
			rest = append(rest, msgs[i])
		}
	}
	for i, r := range pub.Publish(context.Background(), rest) {
		if r.Err != nil {
			t.Fatalf("retry of %s: %v", rest[i].ID, r.Err)
		}
	}
	byGroup := checkOrder(t, readAll(t, c, len(msgs), "t-ga", "t-gb"))
	if len(byGroup["ga"]) != 8 || len(byGroup["gb"]) != 8 {
		t.Fatalf("groups: %v", byGroup)
	}
}

// A record that franz-go may fail alone (too large for a batch) holds its
// group's later records back; invalid messages are permanent as in waves.
func TestPipelinedLargeRecordHoldsGroupBack(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	pub := newPublisher(t, kafka.Config{
		Client:   newClient(t, c, kgo.ProducerBatchMaxBytes(1024)),
		Pipeline: true,
		Topic: func(m *outbox.Message) (string, error) {
			if m.Group == "no-topic" {
				return "", errors.New("no route for this message")
			}
			return m.Topic, nil
		},
	})
	big := []byte(`"` + strings.Repeat("x", 2000) + `"`)
	half := []byte(`"` + strings.Repeat("x", 600) + `"`) // fits a batch, more than half of one
	msgs := []outbox.Message{
		{ID: "1", Topic: "orders", Group: "no-topic", Payload: []byte(`{}`)},
		{ID: "2", Topic: "orders", Group: "no-topic", Payload: []byte(`{}`)},
		{ID: "3", Topic: "orders", Group: "big", Payload: big},
		{ID: "4", Topic: "orders", Group: "big", Payload: []byte(`{}`)},
		{ID: "5", Topic: "orders", Group: "half", Payload: half},
		{ID: "6", Topic: "orders", Group: "half", Payload: []byte(`{}`)},
		{ID: "7", Topic: "orders", Group: "fine", Payload: []byte(`{}`)},
		{ID: "8", Topic: "orders", Group: "fine", Payload: []byte(`{}`)},
	}
	res := pub.Publish(context.Background(), msgs)
	for i, code := range map[int]string{0: "topic", 2: "too_large"} {
		var pe *outbox.PublishError
		if !errors.As(res[i].Err, &pe) || !pe.Permanent || pe.Code != code {
			t.Errorf("message %s: %v, want a permanent %q error", msgs[i].ID, res[i].Err, code)
		}
	}
	for _, i := range []int{1, 3, 5} {
		if !errors.Is(res[i].Err, outbox.ErrNotAttempted) {
			t.Errorf("message %s: %v, want ErrNotAttempted", msgs[i].ID, res[i].Err)
		}
	}
	for _, i := range []int{4, 6, 7} {
		if res[i].Err != nil {
			t.Errorf("message %s: %v", msgs[i].ID, res[i].Err)
		}
	}
	readAll(t, c, 3, "orders")
}

func TestPipelinedCanceled(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c), Pipeline: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := batch("orders", 2, 2, 1)
	for i, r := range pub.Publish(ctx, msgs) {
		if !errors.Is(r.Err, outbox.ErrNotAttempted) || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("%s: %v, want ErrNotAttempted and context.Canceled", msgs[i].ID, r.Err)
		}
	}
}

func TestNewRefusesPipelineWithUnsafeClients(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1))
	for name, cfg := range map[string]kafka.Config{
		"manual flushing":  {Client: newClient(t, c, kgo.ManualFlushing()), Pipeline: true},
		"not idempotent":   {Client: newClient(t, c, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())), Pipeline: true, AllowWeakDurability: true},
		"not a kgo.Client": {Client: producerFunc(func(context.Context, *kgo.Record, func(*kgo.Record, error)) {}), Pipeline: true},
	} {
		if _, err := kafka.New(cfg); err == nil || !strings.Contains(err.Error(), "Pipeline") {
			t.Errorf("%s: %v, want an error naming Config.Pipeline", name, err)
		}
	}
}

type producerFunc func(context.Context, *kgo.Record, func(*kgo.Record, error))

func (f producerFunc) Produce(ctx context.Context, r *kgo.Record, p func(*kgo.Record, error)) {
	f(ctx, r, p)
}
