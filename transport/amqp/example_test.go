package amqp_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	outboxamqp "github.com/outboxkit/outboxkit/transport/amqp"
)

// Publish outbox messages to the "events" exchange, routed by topic. In a
// service the Publisher is handed to outbox.NewProcessor; here it is called
// directly.
func Example() {
	pub, err := outboxamqp.New(outboxamqp.Config{
		URL:      "amqp://guest:guest@127.0.0.1:5672/",
		Exchange: "events",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	res := pub.Publish(context.Background(), []outbox.Message{{
		ID: outbox.NewID(time.Now()), Topic: "orders.paid", Group: "order-42",
		Payload: []byte(`{"order":42}`),
	}})
	fmt.Println(res[0].Err)
}
