// Package postgres is the PostgreSQL store of outboxkit, on pgx/v5.
//
// It implements outbox.Store (claim, outcomes, recovery, receipts, queries,
// housekeeping), outbox.Enqueuer[pgx.Tx] for enqueueing in the caller's pgx
// transaction, outbox.Enqueuer[*sql.Tx] through SQL for database/sql users
// (pgx stdlib driver), and outbox.Waker (LISTEN/NOTIFY wake-ups).
//
// # Setup
//
//	pool, _ := pgxpool.New(ctx, dsn)
//	store, err := postgres.New(pool, postgres.Options{}) // schema public, tables outbox_*
//	err = store.Migrate(ctx)                             // idempotent, safe from many replicas
//	ob := outbox.New(store, outbox.Options{})
//
// # Enqueue
//
//	tx, _ := pool.Begin(ctx)
//	// ... business writes in tx ...
//	_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Group: orderID, Payload: body})
//	err = tx.Commit(ctx) // the message exists if and only if this commits
//
// A batch of messages is one statement (one round trip). A repeated
// (Tenant, IdempotencyKey) returns the stored message with Existed = true
// and leaves the transaction usable; invalid messages are refused before any
// SQL runs.
//
// # Ordering
//
// Messages of one group (Tenant, Topic, Group) are published in sequence
// order, across any number of processors and retries. Two mechanisms make
// that hold:
//   - enqueueing into a group takes a transaction-level advisory lock on it
//     before the sequence number is drawn, so a group's sequence order is its
//     commit order: a later message can never become visible before an
//     earlier one of its group (the failure of sequence- or time-ordered
//     outboxes whose transactions commit out of order);
//   - the claim takes a message only when every earlier unfinished message
//     of its group is taken in the same claim, re-checking locked rows at
//     lock time, so a group with a message in flight, waiting for a retry,
//     or being claimed by another processor is skipped as a whole.
//
// # Wake-up and single-active mode
//
// Store.Wakeups listens on a dedicated connection and falls back to polling
// (with a log line) when notifications cannot arrive, such as behind a
// transaction-mode pooler. Store.Elector elects one active processor with an
// advisory lock.
//
// # Table maintenance
//
// The messages table churns like any queue: every status change writes a
// new row version. Migrate sets aggressive per-table autovacuum settings
// (see migrations/001_init.up.sql): vacuum after 1% of the rows changed
// (plus 1,000), analyze after 2%, and little cost-based delay. Keep
// transactions short on the database (a long-running transaction holds back
// vacuum for every table), prune finished messages with MessagePrune on a
// schedule, and watch the tables' dead rows and the cleanup horizon:
// Store.StorageStats reports both, and names what holds the horizon back
// (outbox/otel turns them into gauges, outboxctl storage prints them).
// Topics that need
// no record of what was sent can be listed in Options.DeleteSentTopics: their
// messages are deleted when sent, which roughly halves the rows and index
// entries written per message.
//
// The store needs PostgreSQL 13 or later and the default READ COMMITTED
// isolation for its own statements.
package postgres
