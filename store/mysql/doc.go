// Package mysql is the outbox store for MySQL 8 and MariaDB 10.6+, over
// database/sql and github.com/go-sql-driver/mysql.
//
// A Store implements outbox.Store (what the processor, webhooks and operators
// use), outbox.Enqueuer[*sql.Tx] (what outbox.Outbox uses to insert messages
// in the application's transaction) and outbox.Waker (an in-process signal,
// so a processor in the same process claims new messages at once).
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	if err != nil { ... }
//	st, err := mysql.New(db, mysql.Options{})
//	if err != nil { ... }
//	if err := st.Migrate(ctx); err != nil { ... }
//
//	ob := outbox.New(st, outbox.Options{})
//	err = st.InTx(ctx, func(tx *sql.Tx) error {
//		// ... business writes in tx ...
//		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Group: orderID, Payload: body})
//		return err
//	}) // committed: the processor is woken at once
//
//	go outbox.Run(ctx, st, publisher, outbox.Config{Topics: []string{"orders"}})
//
// # Guarantees
//
// Enqueue is idempotent per (Tenant, IdempotencyKey) without aborting the
// caller's transaction (INSERT ... ON DUPLICATE KEY UPDATE, then the
// original is read back); several messages with generated IDs go in
// multi-row statements. Enqueueing into an ordered group locks the group's
// row in the <prefix>groups table until the transaction ends, so a group's
// messages commit in sequence order. Claims use SELECT ... FOR UPDATE SKIP
// LOCKED in READ COMMITTED transactions and keep FIFO per (tenant, topic,
// group) across any number of processors. A claim looks for group heads in
// a bounded window of the oldest due messages (index messages_head,
// migration 7), and past it group by group only when the window's groups
// are blocked, so its cost does not grow with the backlog. Outcomes are recorded in batches,
// fenced by the lease. Store-owned transactions chosen as deadlock victims
// are retried.
//
// # Schema
//
// Migrate applies the embedded, versioned migrations (idempotent; replicas
// starting at once serialise on GET_LOCK). Tables are <prefix>messages,
// <prefix>attempts, <prefix>groups and <prefix>schema_version, prefix
// Options.TablePrefix (default "outbox_"). Keys are VARBINARY (compared
// byte for byte); times are DATETIME(6) holding UTC, written as literals, so
// the DSN's parseTime, loc and the session time_zone do not matter. Times a
// Store returns are truncated to the microsecond.
//
// # One shape for every store
//
// Store has the method set of every outboxkit store (the ports, InTx,
// MessageListTx, the migration API with Migrations, the rendered SQL for your
// own migration tool, and Elector, single-active mode by GET_LOCK), checked
// at compile time, and the options TablePrefix, ClaimPerGroup, Clock and
// Logger. Its files are those of every store (store.go, enqueue.go,
// claim.go, finish.go, inbox.go, migrate.go and elector.go), each with
// this store's own part of the operation; the Store's methods, which call
// the shared code, are declared in methods.go (so go doc lists them),
// generated from one template for both stores. The
// database/sql code is shared with store/sqlite; what
// is this store's own is its claim (SKIP LOCKED), its batch of outcomes
// (one UPDATE per kind of outcome), its multi-row insert, its transactions
// (deadlock victims retried) and GET_LOCK for migrations.
//
// # Payloads
//
// Payloads of every content type are stored in a MEDIUMBLOB, byte for byte,
// with the content type beside them. The store's ceiling
// (Store.MaxPayloadBytes, outbox.PayloadLimiter) is 16 MiB - 64 KiB: the
// column holds 16 MiB - 1, and the rest of the row and the statement must
// fit in the server's max_allowed_packet, 16 MiB by default on MariaDB (64
// MiB on MySQL 8). A server configured with a smaller max_allowed_packet
// refuses large payloads with its own error; the enqueue then fails and
// nothing is written.
package mysql
