// Command quickstart shows outboxkit end to end with no setup: an embedded
// SQLite file in a temporary directory, an order and its message written in
// one transaction, a rolled-back order whose message never appears, an
// idempotent repeat, and the processor delivering to a stdout publisher that
// fails one delivery once (retried after a shortened backoff).
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	dir, err := os.MkdirTemp("", "outboxkit-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.db")

	store, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	db := store.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		return err
	}
	fmt.Println("database:", path)

	ob := outbox.New(store, outbox.Options{})
	placeOrder := func(id int, item string, commit bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES (?, ?)`, id, item); err != nil {
			return err
		}
		if _, err := ob.EnqueueTx(ctx, tx, outbox.Message{
			Topic:          "orders",
			Group:          fmt.Sprintf("customer-%d", id%2),
			IdempotencyKey: fmt.Sprintf("order-%d-placed", id),
			Payload:        []byte(fmt.Sprintf(`{"order":%d,"item":%q}`, id, item)),
		}); err != nil {
			return err
		}
		if !commit {
			fmt.Printf("order %d: rolled back\n", id)
			return tx.Rollback()
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		store.Notify() // wake the processor now rather than at its next poll
		fmt.Printf("order %d: committed with its message\n", id)
		return nil
	}
	for _, o := range []struct {
		id     int
		item   string
		commit bool
	}{{1, "espresso", true}, {2, "croissant", true}, {3, "this order is rolled back", false}, {4, "flat white", true}} {
		if err := placeOrder(o.id, o.item, o.commit); err != nil {
			return err
		}
	}
	// An idempotent repeat returns the first message and inserts nothing.
	again, err := ob.Enqueue(ctx, outbox.Message{Topic: "orders", IdempotencyKey: "order-1-placed", Payload: []byte(`{"order":1}`)})
	if err != nil {
		return err
	}
	fmt.Printf("repeat of order-1-placed: existed=%v (message %s)\n", again[0].Existed, again[0].Message.ID)

	// A publisher that prints, and fails order 2 once with a retryable error.
	// PublishEach keeps FIFO: while order 2 waits for its retry, order 4
	// (same customer group) is not published.
	var mu sync.Mutex
	failedOnce := false
	var published []string
	pub := outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result {
		mu.Lock()
		defer mu.Unlock()
		if !failedOnce && m.IdempotencyKey == "order-2-placed" {
			failedOnce = true
			fmt.Printf("publish %s attempt %d: provider unavailable (will retry)\n", m.Payload, m.Attempts)
			return outbox.Result{Err: outbox.Retryable("503", "provider unavailable")}
		}
		fmt.Printf("publish %s attempt %d: ok\n", m.Payload, m.Attempts)
		published = append(published, m.IdempotencyKey)
		return outbox.Result{ProviderMessageID: "demo-" + m.ID}
	})

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, store, outbox.NewRouter().Handle("orders", pub), outbox.Config{
			PollInterval: 100 * time.Millisecond,
			Backoff:      outbox.Backoff{Schedule: []time.Duration{300 * time.Millisecond}}, // shortened for the demo
		})
	}()

	// Wait until nothing is pending or processing.
	var counts map[outbox.Status]int64
	for {
		counts, err = store.MessageCount(ctx, outbox.MessageCountParams{})
		if err != nil {
			stop()
			return err
		}
		if counts[outbox.StatusPending] == 0 && counts[outbox.StatusProcessing] == 0 {
			break
		}
		select {
		case <-ctx.Done():
			stop()
			return errors.New("timed out waiting for delivery")
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}

	var orders int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&orders); err != nil {
		return err
	}
	page, err := store.MessageList(ctx, outbox.MessageListParams{})
	if err != nil {
		return err
	}
	fmt.Println("summary:")
	fmt.Printf("  orders committed: %d, messages stored: %d (the rolled-back order left neither)\n", orders, len(page.Messages))
	for _, m := range page.Messages {
		attempts, err := store.AttemptList(ctx, outbox.AttemptListParams{MessageID: m.ID})
		if err != nil {
			return err
		}
		fmt.Printf("  %s %-9s attempts=%d history=%d provider_id=%s\n", m.IdempotencyKey, m.Status, m.Attempts, len(attempts), m.ProviderMessageID)
	}
	fmt.Printf("  by status: SENT=%d PENDING=%d FAILED=%d\n", counts[outbox.StatusSent], counts[outbox.StatusPending], counts[outbox.StatusFailed])
	pos := map[string]int{}
	for i, k := range published {
		pos[k] = i
	}
	fmt.Printf("  group customer-0 published in order: %v\n", pos["order-2-placed"] < pos["order-4-placed"])
	if orders != 3 || len(page.Messages) != 3 || counts[outbox.StatusSent] != 3 || pos["order-2-placed"] > pos["order-4-placed"] {
		return fmt.Errorf("unexpected result: %d orders, %d messages, %v", orders, len(page.Messages), counts)
	}
	fmt.Println("quickstart: OK")
	return nil
}
