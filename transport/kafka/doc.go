// Package kafka produces outbox messages to Apache Kafka with franz-go
// (github.com/twmb/franz-go), and consumes them idempotently through an
// outbox.Inbox.
//
// A Publisher produces each message as a record keyed by its group (so a
// group stays in one partition, in order), with headers carrying the outbox
// ID, tenant, topic, group, sequence and the message's own headers (trace
// context). It keeps FIFO per group across a batch and across retries: no
// record of a group is produced while an earlier one of the group is
// unresolved. Config.Pipeline instead produces a group's records at once and
// relies on the idempotent producer to keep them in order (much faster for
// deep groups; see Publisher for what it does not cover).
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092"), kgo.ProducerLinger(0)) // idempotent, acks=all by default
//	...
//	pub, err := outboxkafka.New(outboxkafka.Config{Client: cl, TopicPrefix: "outbox."})
//	...
//	proc, err := outbox.NewProcessor(store, pub, outbox.Config{Topics: []string{"orders"}})
//
// A Consumer hands each record to a handler in the consumer's own database
// transaction, through the inbox, and commits the record's offset only after
// that transaction committed; a record delivered twice is handled once.
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092"),
//		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("outbox.orders"),
//		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
//	...
//	c, err := outboxkafka.NewConsumer(outboxkafka.ConsumerConfig[*sql.Tx]{
//		Client: cl, Inbox: outbox.NewInbox(store), Name: "billing", InTx: store.InTx,
//		Handle: func(ctx context.Context, tx *sql.Tx, d outboxkafka.Delivery) error { ... },
//	})
//	...
//	err = c.Run(ctx)
//
// The topics are yours to create: neither side creates one.
package kafka
