package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/transport/kafka"
)

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newClient(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func newPublisher(t *testing.T, cfg kafka.Config) *kafka.Publisher {
	t.Helper()
	p, err := kafka.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readAll consumes topics from the start until it has n records.
func readAll(t *testing.T, c *kfake.Cluster, n int, topics ...string) []*kgo.Record {
	t.Helper()
	cl := newClient(t, c, kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d records of %d", len(recs), n)
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	// Nothing more should arrive (no duplicate, no stray record).
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	cl.PollFetches(short).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	if len(recs) != n {
		t.Fatalf("read %d records, want exactly %d", len(recs), n)
	}
	return recs
}

func header(r *kgo.Record, k string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}

// batch returns groups*per ordered messages (interleaved: the k-th message
// of every group, then the (k+1)-th) plus unordered ones.
func batch(topic string, groups, per, unordered int) []outbox.Message {
	var msgs []outbox.Message
	seq := int64(0)
	for k := range per {
		for g := range groups {
			seq++
			msgs = append(msgs, outbox.Message{
				ID: fmt.Sprintf("m-%c-%d", 'a'+g, k), Tenant: "acme", Topic: topic, Group: fmt.Sprintf("g%c", 'a'+g), Seq: seq,
				Payload: []byte(fmt.Sprintf(`{"k":%d}`, k)),
			})
		}
	}
	for u := range unordered {
		seq++
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("u-%d", u), Topic: topic, Seq: seq, Payload: []byte(`{}`)})
	}
	return msgs
}

// checkOrder asserts that every group's records are in Seq order, each once.
func checkOrder(t *testing.T, recs []*kgo.Record) map[string][]int64 {
	t.Helper()
	seen := map[string]bool{}
	byGroup := map[string][]int64{}
	for _, r := range recs {
		id, _ := header(r, kafka.HeaderID)
		if seen[id] {
			t.Fatalf("record %s twice", id)
		}
		seen[id] = true
		g, _ := header(r, kafka.HeaderGroup)
		if g == "" {
			continue
		}
		if string(r.Key) != g {
			t.Fatalf("record %s: key %q, want the group %q", id, r.Key, g)
		}
		s, _ := header(r, kafka.HeaderSeq)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("record %s: seq header %q", id, s)
		}
		if l := byGroup[g]; len(l) > 0 && l[len(l)-1] >= n {
			t.Fatalf("group %s out of order: %v then %d", g, l, n)
		}
		byGroup[g] = append(byGroup[g], n)
	}
	return byGroup
}

func TestPublishRecords(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(4, "outbox.orders"))
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c), TopicPrefix: "outbox."})

	msgs := batch("orders", 3, 5, 4)
	msgs[0].Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "outbox-id": "spoofed"}
	res := pub.Publish(context.Background(), msgs)
	if len(res) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(res), len(msgs))
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
		if !strings.HasPrefix(r.ProviderMessageID, "outbox.orders/") || !strings.Contains(string(r.ProviderResponse), `"offset"`) {
			t.Fatalf("message %d: provider ID %q, response %s", i, r.ProviderMessageID, r.ProviderResponse)
		}
	}
	recs := readAll(t, c, len(msgs), "outbox.orders")
	byGroup := checkOrder(t, recs)
	if len(byGroup) != 3 || len(byGroup["ga"]) != 5 {
		t.Fatalf("groups: %v", byGroup)
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, _ := header(r, kafka.HeaderID)
		byID[id] = r
	}
	r := byID["m-a-0"]
	if r == nil {
		t.Fatal("record m-a-0 missing (the message's own outbox-id header must not replace the ID)")
	}
	want := map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", kafka.HeaderTenant: "acme",
		kafka.HeaderTopic: "orders", kafka.HeaderGroup: "ga", kafka.HeaderSeq: "1", kafka.HeaderContentType: "application/json",
	}
	for k, v := range want {
		if got, _ := header(r, k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if string(r.Value) != `{"k":0}` {
		t.Errorf("value %s", r.Value)
	}
	// The provider ID and response name the record where it was written.
	if res[0].ProviderMessageID != fmt.Sprintf("outbox.orders/%d/%d", r.Partition, r.Offset) {
		t.Errorf("provider ID %s, record at %d/%d", res[0].ProviderMessageID, r.Partition, r.Offset)
	}
	var resp struct {
		Topic     string
		Partition int32
		Offset    int64
		Timestamp time.Time
	}
	if err := json.Unmarshal(res[0].ProviderResponse, &resp); err != nil || resp.Topic != "outbox.orders" ||
		resp.Partition != r.Partition || resp.Offset != r.Offset || !resp.Timestamp.Equal(r.Timestamp) {
		t.Errorf("provider response %s (%v), record at %d/%d %s", res[0].ProviderResponse, err, r.Partition, r.Offset, r.Timestamp)
	}
	u := byID["u-0"]
	if u == nil || u.Key != nil {
		t.Fatalf("unordered record: %+v", u)
	}
	if _, ok := header(u, kafka.HeaderGroup); ok {
		t.Error("an unordered record carries a group header")
	}
}

// A broker error in the middle of a batch fails the records it answered
// (retryably), stops their groups, and leaves the other groups untouched;
// publishing the rest again completes every group in order.
func TestPublishBrokerErrorMidBatch(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(2), kfake.SeedTopics(1, "t-ga", "t-gb"))
	// Group a's topic on broker 0, group b's on broker 1: one produce
	// request per broker and wave.
	if err := c.MoveTopicPartition("t-ga", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveTopicPartition("t-gb", 0, 1); err != nil {
		t.Fatal(err)
	}
	var toB atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if c.CurrentNode() != 1 || toB.Add(1) != 2 {
			return nil, nil, false
		}
		// The second request to broker 1 (group b's second message) fails.
		preq := req.(*kmsg.ProduceRequest)
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range preq.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.PolicyViolation.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	pub := newPublisher(t, kafka.Config{
		Client: newClient(t, c),
		Topic:  func(m *outbox.Message) (string, error) { return "t-" + m.Group, nil },
	})
	msgs := batch("orders", 2, 4, 0) // a0 b0 a1 b1 a2 b2 a3 b3
	res := pub.Publish(context.Background(), msgs)
	for i, r := range res {
		m := msgs[i]
		switch {
		case m.Group == "ga" || m.ID == "m-b-0":
			if r.Err != nil {
				t.Errorf("%s: %v", m.ID, r.Err)
			}
		case m.ID == "m-b-1":
			var pe *outbox.PublishError
			if !errors.As(r.Err, &pe) || pe.Permanent || pe.Code != "kafka_44" || !outbox.IsRetryable(r.Err) {
				t.Errorf("%s: %v, want a retryable kafka_44 (POLICY_VIOLATION)", m.ID, r.Err)
			}
		default:
			if !errors.Is(r.Err, outbox.ErrNotAttempted) {
				t.Errorf("%s: %v, want ErrNotAttempted (an earlier message of the group failed)", m.ID, r.Err)
			}
		}
	}
	// The processor's retry: the failed message and the rest of its group.
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
	if len(byGroup["ga"]) != 4 || len(byGroup["gb"]) != 4 {
		t.Fatalf("groups: %v", byGroup)
	}
}

// A partition leader that moves while a batch is produced costs the client a
// metadata refresh, not a record: every record is written once, in order.
func TestPublishLeaderChange(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(3), kfake.SeedTopics(1, "orders"))
	before := c.LeaderFor("orders", 0)
	moving, moved := make(chan struct{}), make(chan struct{})
	go func() {
		<-moving
		_ = c.MoveTopicPartition("orders", 0, (before+1)%3)
		close(moved)
	}()
	var produces, toOldLeader atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		n := produces.Add(1)
		if n == 3 {
			// Move the leader while this request waits (the cluster's
			// admin calls cannot run inside a control function); the
			// cluster then answers it from the old leader: NOT_LEADER.
			close(moving)
			c.SleepControl(func() { <-moved })
		}
		if n >= 3 && c.CurrentNode() == before {
			toOldLeader.Add(1)
		}
		return nil, nil, false
	})
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c)})
	msgs := batch("orders", 4, 8, 0)
	for i, r := range pub.Publish(context.Background(), msgs) {
		if r.Err != nil {
			t.Fatalf("%s: %v", msgs[i].ID, r.Err)
		}
	}
	if after := c.LeaderFor("orders", 0); after == before {
		t.Fatalf("the leader did not move (still %d)", after)
	}
	byGroup := checkOrder(t, readAll(t, c, len(msgs), "orders"))
	for g, seqs := range byGroup {
		if len(seqs) != 8 {
			t.Fatalf("group %s: %v", g, seqs)
		}
	}
	if toOldLeader.Load() == 0 {
		t.Fatal("no produce request reached the old leader after the move")
	}
}

func TestPublishInvalidIsPermanent(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	pub := newPublisher(t, kafka.Config{
		Client: newClient(t, c, kgo.ProducerBatchMaxBytes(1024)),
		Topic: func(m *outbox.Message) (string, error) {
			switch m.Group {
			case "bad-name":
				return "no spaces/allowed", nil
			case "no-topic":
				return "", errors.New("no route for this message")
			}
			return m.Topic, nil
		},
	})
	big := []byte(`"` + strings.Repeat("x", 2000) + `"`)
	msgs := []outbox.Message{
		{ID: "1", Topic: "orders", Group: "bad-name", Payload: []byte(`{}`)},
		{ID: "2", Topic: "orders", Group: "no-topic", Payload: []byte(`{}`)},
		{ID: "3", Topic: "orders", Group: "big", Payload: big},
		{ID: "4", Topic: "orders", Group: "big", Payload: []byte(`{}`)},
		{ID: "5", Topic: "orders", Group: "fine", Payload: []byte(`{}`)},
	}
	res := pub.Publish(context.Background(), msgs)
	for i, code := range []string{"topic", "topic", "too_large"} {
		var pe *outbox.PublishError
		if !errors.As(res[i].Err, &pe) || !pe.Permanent || pe.Code != code {
			t.Errorf("message %s: %v, want a permanent %q error", msgs[i].ID, res[i].Err, code)
		}
	}
	if !errors.Is(res[3].Err, outbox.ErrNotAttempted) {
		t.Errorf("message 4: %v, want ErrNotAttempted", res[3].Err)
	}
	if res[4].Err != nil {
		t.Errorf("message 5: %v", res[4].Err)
	}
}

func TestPublishCanceled(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := batch("orders", 2, 2, 1)
	for i, r := range pub.Publish(ctx, msgs) {
		if !errors.Is(r.Err, outbox.ErrNotAttempted) {
			t.Fatalf("%s: %v, want ErrNotAttempted", msgs[i].ID, r.Err)
		}
		first := msgs[i].Group == "" || strings.HasSuffix(msgs[i].ID, "-0")
		if first && !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("%s: %v, want context.Canceled", msgs[i].ID, r.Err)
		}
	}
}

// A broker that never answers costs DeliveryTimeout and a retryable error,
// not a hung processor.
func TestPublishDeliveryTimeout(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c), Topic: func(*outbox.Message) (string, error) { return "missing", nil }, DeliveryTimeout: 500 * time.Millisecond})
	res := pub.Publish(context.Background(), batch("orders", 1, 2, 0))
	if !outbox.IsRetryable(res[0].Err) {
		t.Fatalf("%v, want a retryable error", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) {
		t.Fatalf("%v, want ErrNotAttempted", res[1].Err)
	}
}

func TestNewRefusesWeakClients(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1))
	for name, opts := range map[string][]kgo.Opt{
		"not idempotent": {kgo.DisableIdempotentWrite()},
		"leader ack":     {kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())},
		"cancellation":   {kgo.AllowIdempotentProduceCancellation()},
	} {
		cl := newClient(t, c, opts...)
		if _, err := kafka.New(kafka.Config{Client: cl}); err == nil {
			t.Errorf("%s: New accepted the client", name)
		}
		if _, err := kafka.New(kafka.Config{Client: cl, AllowWeakDurability: true}); err != nil {
			t.Errorf("%s with AllowWeakDurability: %v", name, err)
		}
	}
	cl := newClient(t, c)
	for name, cfg := range map[string]kafka.Config{
		"no client":     {},
		"both topics":   {Client: cl, TopicPrefix: "x.", Topic: func(*outbox.Message) (string, error) { return "x", nil }},
		"neg timeout":   {Client: cl, DeliveryTimeout: -1},
		"neg in flight": {Client: cl, MaxInFlight: -1},
	} {
		if _, err := kafka.New(cfg); err == nil {
			t.Errorf("%s: New accepted the config", name)
		}
	}
}
