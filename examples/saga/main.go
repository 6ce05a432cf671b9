// Command saga runs seed 003's order saga end to end: each saga runs its
// steps in one SQLite transaction that writes the business rows and
// enqueues the saga's events in the outbox; the outbox processor publishes
// them to a broker (Kafka in process by default, or RabbitMQ or NATS
// JetStream); an order-history service consumes them through its inbox, in
// its own database transaction, so an event delivered twice is applied
// once. A saga whose step fails records itself as COMPENSATING and enqueues
// the compensation events in the same transaction; an event whose
// destination stays down is retried and then dead-lettered.
//
//	go run ./examples/saga                      # Kafka (an in-process kfake cluster), no setup
//	go run ./examples/saga -crash               # the processor "crashes" between publish and mark-sent
//	go run ./examples/saga -broker rabbitmq     # amqp://guest:guest@127.0.0.1:5672/ (-amqp-url)
//	go run ./examples/saga -broker nats         # nats://127.0.0.1:4222 with JetStream (-nats-url)
//
// It prints the saga's timeline, then a summary.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"
)

func main() {
	var o Options
	flag.StringVar(&o.Broker, "broker", "kafka", "kafka (in-process kfake), rabbitmq or nats")
	flag.StringVar(&o.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL (-broker rabbitmq)")
	flag.StringVar(&o.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS URL, JetStream enabled (-broker nats)")
	flag.BoolVar(&o.Crash, "crash", false, "crash the processor between publishing OrderCreated and marking it sent")
	flag.StringVar(&o.Dir, "dir", "", "directory of the SQLite databases; empty uses a temporary one")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := Run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "saga:", err)
		os.Exit(1)
	}
}

// Options configures Run.
type Options struct {
	// Broker is "kafka" (an in-process kfake cluster), "rabbitmq" or
	// "nats".
	Broker  string
	AMQPURL string
	NATSURL string
	// Crash makes the processor "crash" between publishing the first
	// saga's OrderCreated and marking it sent.
	Crash bool
	// Dir holds the SQLite databases; "" uses a temporary directory.
	Dir string
}
