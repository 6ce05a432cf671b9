// Package outbox is the core of outboxkit: the transactional outbox pattern
// for Go services. It holds the message model, the state machine, the retry
// backoff, the error types, the ports adapters implement (Store,
// Enqueuer[TTx], Publisher, Observer, Policy) and the Processor. It imports
// the standard library only; databases and providers live in adapter
// packages (store/sqlite, store/postgres, whatsapp, flowcatalyst, ...).
//
// # Enqueue
//
// Write the business data and the message in one transaction of yours: the
// message exists if and only if the transaction commits.
//
//	ob := outbox.New(store, outbox.Options{})
//	tx, err := db.BeginTx(ctx, nil)
//	// ... INSERT INTO orders ... in tx
//	res, err := ob.EnqueueTx(ctx, tx, outbox.Message{
//		Tenant:         "org-1",
//		Topic:          "orders",
//		Group:          "order-42",      // FIFO within (tenant, topic, group)
//		IdempotencyKey: "order-42-created",
//		Payload:        []byte(`{"order":42}`),
//	})
//	err = tx.Commit()
//
// A repeated (Tenant, IdempotencyKey) returns the first message with
// Existed = true and leaves the transaction usable. Invalid messages
// (ErrInvalidInput) and messages a Policy refuses (ErrBlockedByPolicy) are
// reported before any statement runs.
//
// # Payloads
//
// A payload is bytes with a content type (Message.ContentType, "" meaning
// application/json). JSON types (application/json, "+json") must hold one
// UTF-8 JSON document; any other type may hold any bytes (protobuf, Avro,
// binary), kept byte for byte by every store. Payloads are limited to
// Options.MaxPayloadBytes (DefaultMaxPayloadBytes, 1 MiB, by default; up to
// the store's ceiling, see PayloadLimiter); a larger one is refused with a
// *PayloadTooLargeError. Publishers with headers send the content type;
// those that take JSON only fail other types permanently (RequireJSON).
//
//	ob := outbox.New(store, outbox.Options{MaxPayloadBytes: 4 << 20})
//	body, err := proto.Marshal(event)
//	res, err := ob.EnqueueTx(ctx, tx, outbox.Message{
//		Topic: "orders", ContentType: "application/x-protobuf", Payload: body,
//	})
//
// # Run
//
// Run the processor in one or many replicas:
//
//	router := outbox.NewRouter().Handle("orders", myPublisher)
//	err := outbox.Run(ctx, store, router, outbox.Config{})
//
// It claims due messages atomically, publishes them in batches with at most
// Config.MaxConcurrentGroups groups at once, keeps FIFO per group across
// processors and retries, retries retryable failures after 1, 5, 15, 60 and
// 360 minutes (a publisher's retry-after wins), dead-letters after
// Config.MaxAttempts (6) attempts or at once on a permanent error, renews
// the leases of what it holds (on a store that is a LeaseExtender), recovers
// messages whose processor died (after Config.ProcessingTimeout; a lost
// lease does not count as an attempt, and Config.MaxRecoveries (5) of them
// dead-letter a message), and shuts down cleanly when ctx is cancelled. Every default is documented on Config.
//
// A dead letter lets its group move on by default; Config.DeadLetter can
// make it hold its group instead (DeadLetterBlock, per topic) until it is
// requeued, then published first, or cancelled.
//
// A processor claims only the topics it names: Config.Topics, or the topics
// registered on its Router; Config.AllTopics claims every topic. It refuses
// to start with an empty router or a nil publisher, and Run returns
// ErrNotMigrated or ErrStoreUnavailable when its store probe fails, rather
// than dead-lettering or looping. Processor.Health serves readiness checks,
// Processor.Progress counts the work (and lists topics nobody claims), and
// Processor.WaitDrained waits until everything due is done:
//
//	p, err := outbox.NewProcessor(store, router, outbox.Config{})
//	go p.Run(ctx)
//	err = p.WaitDrained(ctx) // e.g. in a batch job, before exiting
//
// # Publishers and errors
//
// A Publisher returns one Result per message. Failures are classified with
// Permanent, Retryable and RetryAfter (a *PublishError carrying the
// provider's code); any other error is retryable. ErrNotAttempted puts a
// message back without counting an attempt.
//
// # Delivery tracking
//
// Provider receipts (sent, delivered, read, failed) are applied with
// Store.MessageApplyReceipt, which uses ApplyReceipt: idempotent, tenant
// scoped, never moving a message backwards. Every attempt is kept
// (Store.AttemptList). Observers receive enqueued, attempt, sent, failed,
// delivery and policy hooks for audit trails and metrics.
//
// # States
//
// PENDING → PROCESSING → SENT → DELIVERED; PROCESSING → PENDING (retry,
// release, expired lease); PROCESSING → FAILED (dead letter); SENT → FAILED
// (failed receipt); PENDING → CANCELLED; FAILED → PENDING (requeue);
// FAILED → CANCELLED (a dead letter given up). See
// Transition and docs/state_machine.md.
//
// # Stores
//
// store/sqlite is the embedded default (no server, no cgo); store/postgres
// is the production store. Outside Store implementations are welcome: they
// must pass the conformance suite in outbox/outboxtest/storetest. The Store and
// Enqueuer interfaces may gain methods before v1.0; from v1.0 they follow
// semver.
//
// # Many databases
//
// A service with one outbox per database (a database per tenant, or
// sharded data) runs a Fleet in each of its instances instead of one
// Processor per database: the instances lease the databases among
// themselves through a ShardLeaser (store/postgres.ShardLeaser keeps the
// leases in one PostgreSQL database), each serving about its share, and
// every database is served by one instance at a time. FleetConfig.Open
// opens a database's store when its lease is taken; Fleet.Status reports
// each database's health and progress.
//
// # Testing
//
// Package outboxtest offers a recording Publisher, a fake Clock and
// assertions on enqueued messages and drained stores.
//
// # Operations
//
// Admin is the operator's port (search across tenants, topic stats, bulk
// requeue of dead letters in chunks, pauses): every store of this module
// implements it. outbox/admin serves it as an HTTP API with a dashboard,
// outbox/cmd/outboxctl as a command line, and outbox/otel turns the
// Observer hooks into OpenTelemetry metrics and traces.
package outbox
