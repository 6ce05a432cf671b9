// Package sqlite is the embedded default outbox store: pure-Go SQLite
// (modernc.org/sqlite, no cgo), for the quickstart, tests and small services.
//
// A Store implements outbox.Store (what the processor, webhooks and operators
// use), outbox.Enqueuer[*sql.Tx] (what outbox.Outbox uses to insert messages)
// and outbox.Waker (an in-process signal, so a processor in the same process
// claims new messages at once).
//
//	st, err := sqlite.Open(ctx, "app.db", sqlite.Options{})
//	if err != nil { ... }
//	defer st.Close()
//	if err := st.Migrate(ctx); err != nil { ... }
//
//	ob := outbox.New(st, outbox.Options{})
//	err = st.InTx(ctx, func(tx *sql.Tx) error {
//		// ... business writes in tx ...
//		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: body})
//		return err
//	}) // committed: the processor is woken at once
//
//	go outbox.Run(ctx, st, publisher, outbox.Config{Topics: []string{"orders"}})
//
// SQLite serialises writers: every write transaction of the store begins
// with BEGIN IMMEDIATE and waits for the lock up to the busy timeout, so
// several processors (goroutines or processes) on one database file are safe,
// and a claim is atomic. FIFO per group holds across them.
//
// Times are stored as integer Unix microseconds in UTC, so the times a Store
// returns are truncated to the microsecond.
//
// JSON payloads are stored as TEXT (json_extract reads them), payloads of
// other content types as BLOBs, byte for byte. The store's payload ceiling
// (Store.MaxPayloadBytes, outbox.PayloadLimiter) is 64 MiB.
//
// # One shape for every store
//
// Store has the method set of every outboxkit store (the ports, InTx,
// MessageListTx, the migration API with Migrations, the rendered SQL for your
// own migration tool, and Elector, single-active mode within one process),
// checked at compile time, and the options TablePrefix, ClaimPerGroup, Clock
// and Logger. Its files are those of every store (store.go, enqueue.go,
// claim.go, finish.go, inbox.go, migrate.go and elector.go), each with
// this store's own part of the operation; the Store's methods, which call
// the shared code, are declared in methods.go (so go doc lists them),
// generated from one template for both stores. The
// database/sql code is shared with store/mysql; what is
// this store's own is its claim (under BEGIN IMMEDIATE, with a per-store
// group cursor), its batch of outcomes (one fenced UPDATE ... RETURNING per
// outcome), its insert and its transactions.
package sqlite
