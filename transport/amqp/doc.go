// Package amqp publishes outbox messages to RabbitMQ (AMQP 0-9-1) with
// publisher confirms.
//
// A Publisher sends each message, persistent and mandatory, to an exchange
// and routing key (by default Config.Exchange and the message's Topic), with
// the outbox ID as message-id and the message's headers plus its ID, tenant,
// topic and group in the headers table, and counts it sent once the broker
// confirms it. It owns its connection and re-opens the channel or re-dials
// the connection when either is lost.
//
//	pub, err := outboxamqp.New(outboxamqp.Config{
//		URL:      "amqp://app:secret@rabbitmq:5672/",
//		Exchange: "events",
//	})
//	...
//	defer pub.Close()
//	proc, err := outbox.NewProcessor(store, pub, outbox.Config{Topics: []string{"orders"}})
//
// Exchanges, queues and bindings are yours to declare: the Publisher never
// declares them. See Publisher for the outcomes, ordered groups and
// cancellation.
package amqp
