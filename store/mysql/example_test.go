package mysql_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"os"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// The whole round trip: migrate, enqueue in the application's transaction
// with InTx, and run a processor in the same process (InTx wakes it).
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN")) // e.g. app:secret@tcp(db:3306)/app
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := mysql.New(db, mysql.Options{}) // tables outbox_*
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // idempotent, safe from many replicas
		log.Fatal(err)
	}

	ob := outbox.New[*sql.Tx](store, outbox.Options{})
	err = store.InTx(ctx, func(tx *sql.Tx) error {
		// ... the application's own writes in tx ...
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{
			Topic:          "orders",
			Group:          "order-42", // FIFO per order
			IdempotencyKey: "order-42-created",
			Payload:        json.RawMessage(`{"order":42,"event":"created"}`),
		})
		return err
	}) // the message exists if and only if this commits
	if err != nil {
		log.Fatal(err)
	}

	publisher := outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result {
		// send m.Payload to the broker or provider
		return outbox.Result{}
	})
	go func() { _ = outbox.Run(ctx, store, publisher, outbox.Config{Topics: []string{"orders"}}) }()
}

// Single-active mode: of all replicas running this, only the leader
// claims. The leader holds GET_LOCK on a connection of its own; when its
// process dies, the server releases the lock and another replica takes
// over within its RetryInterval.
func ExampleElector() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := mysql.New(db, mysql.Options{})
	if err != nil {
		log.Fatal(err)
	}
	publisher := outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result { return outbox.Result{} })

	el := store.Elector(mysql.ElectorOptions{})
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
