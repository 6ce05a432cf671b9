// Package mongo is the MongoDB store: an outbox.Store, an
// outbox.Enqueuer[context.Context] and an outbox.InboxStore[context.Context]
// on go.mongodb.org/mongo-driver/v2.
//
// # The caller's transaction
//
// In driver v2 the session travels in the context, so the "transaction"
// this store takes is that context: inside Session.WithTransaction (or
// InTx) pass the callback's context both as the context and as the
// transaction, and the messages commit or abort with your own writes:
//
//	ob := outbox.New[context.Context](store, outbox.Options{})
//	_, err := sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
//		if _, err := orders.InsertOne(ctx, order); err != nil {
//			return nil, err
//		}
//		return ob.EnqueueTx(ctx, ctx, outbox.Message{Topic: "orders", Group: order.ID, Payload: body})
//	})
//
// Transactions need a replica set (or a sharded cluster). Against a
// standalone server, or a compatible server without transactions, EnqueueTx
// still works but writes at once: the messages are then NOT atomic with the
// caller's other writes (an abort leaves them in place).
//
// # Collections
//
// Options.TablePrefix (default "outbox_") names seven collections:
// messages, attempts (the attempt history), locks (short-lived claim and
// enqueue locks, and the Elector's lease for single-active mode), counters (the sequence), inbox, pauses (outbox.Admin's
// paused topics and groups) and migrations (the applied schema versions).
// Migrate creates their indexes: a unique one on (tenant, key) makes
// enqueue idempotent, a unique one on seq orders groups and pages listings,
// others serve the claim, recovery, receipts (tenant, provider ID),
// listings, pruning and the operators' topic stats. The schema is
// versioned like the SQL stores' (MigrateTo, SchemaVersion), and
// Migrations renders each version as mongosh commands for teams that apply
// their schema themselves.
//
// # Operators
//
// The Store implements outbox.Admin: MessageSearch across tenants,
// MessageRequeueMany (one fenced updateMany per chunk: each message moves
// atomically, not the chunk), pauses that every claim reads first, and
// TopicStats (one $group aggregation and one index lookup per topic).
// outboxctl takes mongodb:// URLs.
//
// # Claims: correct by construction
//
// A claim never relies on a multi-document transaction or on
// findOneAndUpdate being atomic across documents. It locks each group (and
// each unordered message) it wants by inserting a document whose unique _id
// names it: exactly one concurrent insert succeeds. Under the lock it reads
// the group's open messages in Seq order and leases the run of PENDING due
// messages from the head (at most Options.ClaimPerGroup of a group while
// other groups fill the claim), with updates fenced by status and attempt
// count; then it deletes the locks. Enqueue outside a transaction takes the same
// group lock, so a claim never sees a later message of a group before an
// earlier one; inside a transaction the single sequence counter document
// serialises enqueuing transactions, so a group's order is its commit
// order. Outcomes are fenced by the lease (PROCESSING, owner, attempt, and
// the claim's op as its claim token) and written in one bulk write; when some did not apply, the ones that did are
// read back by a token they set. A lock whose holder died expires after
// Options.LockTTL.
//
// Round trips: a claim takes six whatever its size (the pauses, the due
// messages, the locks, the locked messages, the lease, the lock release),
// more only when the groups it found were blocked or locks had to be taken
// over; a batch of outcomes two (the bulk write and the attempt history),
// a lease extension one. The fenced updates that differ only in the
// message are sent as one multi-document update over the messages' _ids.
//
// Times are stored as BSON dates: millisecond precision.
//
// # What was verified where
//
// The conformance suite (outbox/outboxtest/storetest) runs in CI against
// FerretDB v1.24.2 (MongoDB wire protocol over PostgreSQL), including the
// concurrent-claim and multi-processor FIFO cases, which exercise the
// unique-index locks, and the Admin cases. FerretDB v1.24 is not atomic
// where MongoDB is: it runs an update by reading the matching documents and
// writing each back whole, so of two concurrent updates of one document one
// can be lost; there the claims stay correct by the lock documents, and the
// store writes one owner's lease extensions, outcomes and recoveries one
// at a time, within one process (an extension racing an outcome put
// finished messages back to PROCESSING; a recovery racing its owner's
// release and new claim freed the new lease). FerretDB also keeps a PostgreSQL connection per
// single-document update of a command until the command ends, which
// deadlocked its pool under concurrent bulk writes, so every fenced update
// is sent as a multi-document one over the message's unique _id (the same
// on MongoDB). FerretDB has no multi-document transactions and no
// change streams, so there the cases that need caller transactions skip,
// naming the capability, and Wakeups falls back to this process's own
// signal and polling. The same suite runs against a real replica set when
// OUTBOXKIT_MONGO_URI names one; with transactions MongoDB aborts one of
// two conflicting transactions instead of making it wait, so the inbox's
// "second transaction waits" cases skip there too (the inbox is still
// exactly-once: Session.WithTransaction retries the aborted one, which then
// sees the record).
package mongo
