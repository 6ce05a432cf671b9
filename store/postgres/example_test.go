package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// The whole round trip: migrate, enqueue in the application's transaction,
// run a processor (woken by LISTEN/NOTIFY) that publishes in group order.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, postgres.Options{}) // tables public.outbox_*
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // idempotent, safe from many replicas
		log.Fatal(err)
	}

	ob := outbox.New[pgx.Tx](store, outbox.Options{})
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// ... the application's own writes in tx ...
	_, err = ob.EnqueueTx(ctx, tx, outbox.Message{
		Topic:          "orders",
		Group:          "order-42", // FIFO per order
		IdempotencyKey: "order-42-created",
		Payload:        json.RawMessage(`{"order":42,"event":"created"}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil { // the message exists if and only if this commits
		log.Fatal(err)
	}

	publisher := outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result {
		// send m.Payload to the broker or provider
		return outbox.Result{}
	})
	go func() { _ = outbox.Run(ctx, store, publisher, outbox.Config{Topics: []string{"orders"}}) }()
}

// Enqueueing from database/sql code (pgx stdlib driver on the same pool).
func ExampleStore_SQL() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	ob := outbox.New[*sql.Tx](store.SQL(), outbox.Options{})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: json.RawMessage(`{}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// Single-active mode: of all replicas running this, only the leader claims.
func ExampleElector() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	publisher := outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result { return outbox.Result{} })

	el := store.Elector(postgres.ElectorOptions{})
	// Either run the processor only while leading ...
	go func() {
		_ = el.Run(ctx, func(ctx context.Context) {
			_ = outbox.Run(ctx, store, publisher, outbox.Config{Topics: []string{"orders"}})
		})
	}()
	// ... or keep it running and let it idle while not leading:
	//	go el.Run(ctx, nil)
	//	outbox.Run(ctx, store, publisher, outbox.Config{Leader: el})
}

// Watching what a queue table costs the database: dead row versions that
// keep growing, or a cleanup horizon held by a transaction left open, slow
// every claim. outbox/otel reports the same figures as gauges.
func ExampleStore_StorageStats() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.StorageStats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range st.Tables {
		log.Printf("%s: %d live rows, %d dead, last vacuum %v", t.Name, t.LiveRows, t.DeadRows, t.LastCleanup)
	}
	if st.Horizon.AgeTransactions > 100_000 {
		log.Printf("vacuum is held back %d transactions by %s", st.Horizon.AgeTransactions, st.Horizon.Holder)
	}
}
