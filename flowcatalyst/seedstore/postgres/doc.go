// Package postgres is an outbox.Store over seed 004's outbox tables
// (outbox_events and outbox_dispatch_jobs, the FlowCatalyst outbox
// processor's) in PostgreSQL, exactly as the seed defines them and as
// applications in any language write them, so that outboxkit's processor
// can replace the seed's. Package seedstore (the parent directory) gives
// the schema and how a row maps to an outbox.Message; packages mysql and
// mongo beside this one are the same Store on MySQL/MariaDB and MongoDB.
//
//	db, err := sql.Open("pgx", dsn) // github.com/jackc/pgx/v5/stdlib
//	store, err := postgres.New(db, postgres.Options{})
//	p, err := outbox.NewProcessor(store, publisher, outbox.Config{Topics: store.Topics()})
//
// # FIFO
//
// Claims keep FIFO per (table, message_group) with any number of processors:
// a row is claimed only when every earlier unfinished row of its group
// (PENDING, including one waiting for a retry, or PROCESSING) is claimed in
// the same statement. Claims use FOR UPDATE SKIP LOCKED, so claimers never
// wait for each other. The claim finds each group's head through the seed's
// index, one probe per group, so its cost follows the rows it claims and
// the number of groups, whatever the table's statistics. Rows of a group
// are ordered by created_at (microseconds); MessageEnqueue gives each
// message a later created_at than the one before.
//
// # Enqueue
//
// Applications in any language insert rows with plain SQL. Go code may use
// Insert, or outbox.New[*sql.Tx](store, ...): the Store is an
// outbox.Enqueuer[*sql.Tx] (see MessageEnqueueTx for how a Message maps to
// a row).
//
// # Files
//
// store.go holds New and Options; enqueue.go Insert and MessageEnqueue;
// claim.go MessageClaim; finish.go MessageFinish and MessageRecover;
// query.go the reads, requeue and prune (run by
// flowcatalyst/seedstore/internal/seedsql, shared with the other SQL
// store); migrate.go CreateTables; sql.go
// every statement, one named constant each.
package postgres
