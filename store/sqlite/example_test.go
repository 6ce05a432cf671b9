package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// Enqueue a message in the application's transaction with InTx, and let a
// processor in the same process publish it at once (InTx wakes it).
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outboxkit-example-")
	defer os.RemoveAll(dir)

	st, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY)`); err != nil {
		panic(err)
	}

	published := make(chan string, 1)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		out := make([]outbox.Result, len(msgs))
		for i, m := range msgs {
			published <- string(m.Payload)
			out[i] = outbox.Result{ProviderMessageID: "demo-1"}
		}
		return out
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, st, pub, outbox.Config{Topics: []string{"orders"}, PollInterval: time.Minute})
	}()

	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	err = st.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (1)`); err != nil {
			return err
		}
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Group: "customer-7", Payload: []byte(`{"order":1}`)})
		return err
	})
	if err != nil {
		panic(err)
	}
	// The poll interval is a minute: the message arrives because InTx woke
	// the processor.
	select {
	case p := <-published:
		fmt.Println("published", p)
	case <-time.After(10 * time.Second):
		fmt.Println("not published")
	}
	stop()
	<-done
	// Output: published {"order":1}
}

// Single-active mode in one process: of the Electors on one database file,
// only the leader runs its processor; when it stops, another takes over at
// once.
func ExampleElector() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outboxkit-example-")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()

	led := make(chan string)
	run := func(ctx context.Context, name string) chan error {
		done := make(chan error, 1)
		el := st.Elector(sqlite.ElectorOptions{})
		go func() {
			done <- el.Run(ctx, func(ctx context.Context) {
				led <- name
				<-ctx.Done() // e.g. outbox.Run(ctx, st, publisher, cfg)
			})
		}()
		return done
	}
	ctxA, stopA := context.WithCancel(ctx)
	doneA := run(ctxA, "replica A")
	fmt.Println(<-led, "leads")
	ctxB, stopB := context.WithCancel(ctx)
	doneB := run(ctxB, "replica B")
	stopA() // replica A stops: B takes over without waiting
	<-doneA
	fmt.Println(<-led, "leads")
	stopB()
	<-doneB
	// Output:
	// replica A leads
	// replica B leads
}
