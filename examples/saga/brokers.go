package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/outbox"
	outboxamqp "github.com/outboxkit/outboxkit/transport/amqp"
	outboxkafka "github.com/outboxkit/outboxkit/transport/kafka"
	outboxnats "github.com/outboxkit/outboxkit/transport/nats"
)

// newBroker sets up the broker o names, with names of its own (a run never
// sees another run's events), and returns its publisher and consumer.
func newBroker(ctx context.Context, o Options) (*broker, error) {
	switch o.Broker {
	case "", "kafka":
		return newKafka()
	case "rabbitmq":
		return newRabbitMQ(ctx, o.AMQPURL)
	case "nats":
		return newNATS(ctx, o.NATSURL)
	}
	return nil, fmt.Errorf("unknown broker %q (kafka, rabbitmq or nats)", o.Broker)
}

// newKafka starts an in-process Kafka (franz-go's kfake) with the topic
// "saga.orders"; the order events are keyed by order, so an order's events
// share a partition.
func newKafka() (*broker, error) {
	const topic = "saga." + TopicOrders
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		return nil, err
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ProducerLinger(0)) // idempotent, acks=all
	if err != nil {
		cluster.Close()
		return nil, err
	}
	pub, err := outboxkafka.New(outboxkafka.Config{Client: producer, TopicPrefix: "saga."})
	if err != nil {
		producer.Close()
		cluster.Close()
		return nil, err
	}
	consume := func(ctx context.Context, h *history) error {
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
			kgo.ConsumerGroup(consumerName), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
			kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			return err
		}
		defer cl.Close()
		c, err := outboxkafka.NewConsumer(outboxkafka.ConsumerConfig[*sql.Tx]{
			Client: cl, Inbox: h.inbox, Name: consumerName, InTx: h.db.InTx,
			Handle: func(ctx context.Context, tx *sql.Tx, d outboxkafka.Delivery) error {
				_, err := apply(ctx, tx, d.ID, d.Payload)
				return err
			},
			OnHandled:   func(d outboxkafka.Delivery) { h.handled(d.Payload) },
			OnDuplicate: func(d outboxkafka.Delivery) { h.duplicate(d.ID, d.Payload) },
			RetryDelay:  100 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	return &broker{name: "Kafka (in-process kfake)", pub: pub, consume: consume, close: func() {
		producer.Close()
		cluster.Close()
	}}, nil
}

// newRabbitMQ declares a queue of its own; the order events are routed to
// it through the default exchange.
func newRabbitMQ(ctx context.Context, url string) (*broker, error) {
	queue := "saga-orders-" + randomSuffix()
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, false, false, false, false, nil)
	}
	if err == nil {
		err = ch.Qos(1, 0, false) // one unacknowledged delivery at a time: in order
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	pub, err := outboxamqp.New(outboxamqp.Config{
		URL:   url,
		Route: func(*outbox.Message) (string, string, error) { return "", queue, nil },
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	consume := func(ctx context.Context, h *history) error {
		deliveries, err := ch.ConsumeWithContext(ctx, queue, consumerName, false, false, false, false, nil)
		if err != nil {
			return err
		}
		for d := range deliveries {
			tenant, _ := d.Headers[outboxamqp.HeaderTenant].(string)
			for {
				err := h.deliver(ctx, d.MessageId, tenant, d.Body)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return nil // not acknowledged: redelivered to the next consumer
				}
				h.tl.printf("  order-history  failed             %s: %v (retrying)", describe(d.Body), err)
				time.Sleep(100 * time.Millisecond)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
		}
		return nil
	}
	return &broker{name: "RabbitMQ", pub: pub, consume: consume, close: func() {
		_ = pub.Close()
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = conn.Close()
	}}, nil
}

// newNATS creates a stream of its own. Its duplicate window is short (the
// Publisher's Nats-Msg-Id would otherwise drop the crashed event's second
// publication in the stream), so that the inbox shows its part.
func newNATS(ctx context.Context, url string) (*broker, error) {
	suffix := randomSuffix()
	stream, subjects := "SAGA_"+suffix, "saga-"+suffix
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subjects + ".>"}, Storage: jetstream.MemoryStorage, Duplicates: 100 * time.Millisecond,
	}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: %w", err)
	}
	pub, err := outboxnats.New(outboxnats.Config{JetStream: js, SubjectPrefix: subjects + "."})
	if err != nil {
		nc.Close()
		return nil, err
	}
	consume := func(ctx context.Context, h *history) error {
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy,
			MaxAckPending: 1, // one unacknowledged message at a time: in order
		})
		if err != nil {
			return err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			if err := h.deliver(ctx, m.Headers().Get(outboxnats.HeaderID), m.Headers().Get(outboxnats.HeaderTenant), m.Data()); err != nil {
				if ctx.Err() == nil {
					h.tl.printf("  order-history  failed             %s: %v (retrying)", describe(m.Data()), err)
				}
				_ = m.NakWithDelay(100 * time.Millisecond)
				return
			}
			_ = m.Ack()
		})
		if err != nil {
			return err
		}
		<-ctx.Done()
		cc.Stop()
		return nil
	}
	return &broker{name: "NATS JetStream", pub: pub, consume: consume, close: func() {
		_ = js.DeleteStream(context.Background(), stream)
		nc.Close()
	}}, nil
}
