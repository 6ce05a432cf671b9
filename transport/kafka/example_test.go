package kafka_test

import (
	"context"
	"fmt"
	"log"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/outbox"
	outboxkafka "github.com/outboxkit/outboxkit/transport/kafka"
)

// Produce outbox messages to the topic "outbox.orders", keyed by group. In
// a service the Publisher is handed to outbox.NewProcessor; here it is
// called directly, against an in-process cluster.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	pub, err := outboxkafka.New(outboxkafka.Config{Client: cl, TopicPrefix: "outbox."})
	if err != nil {
		log.Fatal(err)
	}
	res := pub.Publish(context.Background(), []outbox.Message{
		{ID: "01J0000000000000000000000A", Topic: "orders", Group: "order-42", Seq: 1, Payload: []byte(`{"type":"OrderCreated"}`)},
		{ID: "01J0000000000000000000000B", Topic: "orders", Group: "order-42", Seq: 2, Payload: []byte(`{"type":"OrderPaid"}`)},
		{ID: "01J0000000000000000000000C", Topic: "no such topic!", Payload: []byte(`{}`)},
	})
	for _, r := range res {
		fmt.Println(r.ProviderMessageID, r.Err)
	}
	// Output:
	// outbox.orders/0/0 <nil>
	// outbox.orders/0/1 <nil>
	//  publish failed (permanent, code topic): "outbox.no such topic!" is not a valid Kafka topic name
}
