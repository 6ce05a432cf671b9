package nats_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit/outbox"
	outboxnats "github.com/outboxkit/outboxkit/transport/nats"
)

// Publish outbox messages to a JetStream stream that captures "outbox.>".
// In a service the Publisher is handed to outbox.NewProcessor; here it is
// called directly.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "OUTBOX", Subjects: []string{"outbox.>"}, Duplicates: 10 * time.Minute,
	}); err != nil {
		log.Fatal(err)
	}
	pub, err := outboxnats.New(outboxnats.Config{JetStream: js, SubjectPrefix: "outbox."})
	if err != nil {
		log.Fatal(err)
	}
	res := pub.Publish(ctx, []outbox.Message{{
		ID: outbox.NewID(time.Now()), Topic: "orders", Group: "order-42",
		Payload: []byte(`{"order":42,"status":"paid"}`),
	}})
	fmt.Println(res[0].ProviderMessageID, res[0].Err)
}
