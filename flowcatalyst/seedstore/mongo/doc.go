// Package mongo is an outbox.Store over seed 004's outbox collections
// (outbox_events and outbox_dispatch_jobs, the FlowCatalyst outbox
// processor's) in MongoDB, as the seed's MongoDB variant defines them and
// as applications in any language write them, so that outboxkit's
// processor can replace the seed's. Package seedstore (the parent
// directory) gives the schema and how a row maps to an outbox.Message;
// packages postgres and mysql beside this one are the same Store on SQL
// databases. Options.EventsTable and Options.DispatchJobsTable name the
// collections, which hold the seed's documents:
//
//	{
//	    "_id": "0HZXEQ5Y8JY5Z",        // a TSID (an ObjectId is accepted too)
//	    "type": "EVENT",
//	    "messageGroup": "order-123",   // null or missing = the group "default"
//	    "payload": "{...}",            // a JSON string (an embedded document is sent as JSON)
//	    "status": "PENDING",
//	    "retryCount": 0,
//	    "createdAt": ISODate("2025-01-15T10:30:00Z"),
//	    "processedAt": null,
//	    "errorMessage": null
//	}
//
// CreateTables creates the seed's index {status: 1, messageGroup: 1,
// createdAt: 1} on both collections.
//
// The behaviour is the PostgreSQL Store's (FIFO per messageGroup, null as
// the group "default", outcomes fenced by the claim time, retries and
// recovery on the database's clock), built from operations that are atomic
// on MongoDB by construction, not from findOneAndUpdate loops:
//
//   - a claim locks each group it works on by inserting a document whose
//     unique _id names the group into Options.LocksCollection (of
//     concurrent inserts exactly one succeeds); under the lock one read
//     returns the group's unfinished documents, PROCESSING first, then in
//     (createdAt, _id) order, and one updateMany (fenced by status PENDING)
//     leases the run of due PENDING documents from the head (none while a
//     document is PROCESSING or the head waits for a retry), then the lock
//     is deleted. Locks are inserted and deleted a batch of groups at a
//     time. A lock left by a processor that died expires after 30 s;
//   - groups are visited in turn (round robin by name), not oldest first:
//     the claim reads the groups of a bounded window of PENDING and
//     PROCESSING documents through the seed's index instead of sorting
//     every PENDING document;
//   - a claim hands out what it leased once it has worked for 250 ms
//     after its first lease, and a Store's first claim after its first 8
//     documents, so a slow server sends early; Wakeups then brings the
//     next claim at once;
//   - "now" is the server's clock (the hello command's localTime), read
//     once per claim, outcome and recovery, so processors on hosts with
//     skewed clocks agree; times are BSON dates (milliseconds);
//   - an outcome applies only while its document is PROCESSING with the
//     processedAt this Store's claim wrote.
//
// Documents inserted by any client (insertOne with the seed's fields) are
// claimed. Go code may use Insert, or outbox.New[context.Context](store,
// ...): the Store is an outbox.Enqueuer[context.Context] whose "transaction"
// is the context carrying the caller's session, as in store/mongo.
//
// # Files
//
// store.go holds New and Options; enqueue.go Insert and MessageEnqueue;
// claim.go MessageClaim, groups.go the groups a claim visits, locks.go the
// group locks; finish.go MessageFinish and MessageRecover; query.go the
// reads, requeue and prune; model.go the documents; migrate.go
// CreateTables.
package mongo
