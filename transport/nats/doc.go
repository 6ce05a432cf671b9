// Package nats publishes outbox messages to NATS JetStream.
//
// A Publisher sends each message to a subject (by default the message's
// Topic, optionally prefixed), carries its headers plus the outbox ID,
// tenant, topic and group, and waits for the stream's PubAck. The outbox ID
// is the JetStream message ID (Nats-Msg-Id), so a message the processor
// publishes again after a crash is deduplicated by the stream within its
// duplicate window.
//
//	nc, err := nats.Connect(url) // github.com/nats-io/nats.go
//	...
//	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
//	...
//	pub, err := outboxnats.New(outboxnats.Config{JetStream: js, SubjectPrefix: "outbox."})
//	...
//	proc, err := outbox.NewProcessor(store, pub, outbox.Config{Topics: []string{"orders"}})
//
// The streams are yours to create: the Publisher never declares one. See
// Publisher for the outcomes, ordered groups and cancellation.
package nats
