package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// Enqueue a message in the same transaction as the business write, then run
// the processor until the message is delivered.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	_, _ = store.DB().ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY)`)

	ob := outbox.New[*sql.Tx](store, outbox.Options{})
	err = store.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (42)`); err != nil {
			return err
		}
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Group: "order-42", Payload: []byte(`{"order":42}`)})
		return err
	})
	if err != nil {
		panic(err)
	}

	delivered := make(chan struct{})
	pub := outbox.PublishEach(func(_ context.Context, m outbox.Message) outbox.Result {
		fmt.Printf("published %s to %s\n", m.Payload, m.Topic)
		close(delivered)
		return outbox.Result{ProviderMessageID: "provider-1"}
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- outbox.Run(runCtx, store, outbox.NewRouter().Handle("orders", pub), outbox.Config{}) }()
	<-delivered
	stop()
	<-done

	page, _ := store.MessageList(ctx, outbox.MessageListParams{})
	fmt.Println(page.Messages[0].Status, page.Messages[0].ProviderMessageID)
	// Output:
	// published {"order":42} to orders
	// SENT provider-1
}

// A message that keeps failing is retried on the backoff schedule and then
// dead-lettered; an operator can requeue it.
func Example_deadLetter() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	store, _ := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	defer store.Close()
	_ = store.Migrate(ctx)

	ob := outbox.New[*sql.Tx](store, outbox.Options{})
	res, _ := ob.Enqueue(ctx, outbox.Message{Topic: "sms", Payload: []byte(`{"to":"+31600000000"}`), MaxAttempts: 3})
	id := res[0].Message.ID

	pub := outbox.PublishEach(func(context.Context, outbox.Message) outbox.Result {
		return outbox.Result{Err: outbox.Retryable("503", "gateway unavailable")}
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- outbox.Run(runCtx, store, pub, outbox.Config{
			Topics:       []string{"sms"},
			PollInterval: 10 * time.Millisecond,
			Backoff:      outbox.Backoff{Schedule: []time.Duration{10 * time.Millisecond}}, // shortened
		})
	}()
	for {
		m, _ := store.MessageGet(ctx, outbox.MessageGetParams{ID: id})
		if m.Status == outbox.StatusFailed {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	<-done

	attempts, _ := store.AttemptList(ctx, outbox.AttemptListParams{MessageID: id})
	for _, a := range attempts {
		fmt.Println(a.Number, a.Outcome, a.Error.Code)
	}
	m, _ := store.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: id})
	fmt.Println("requeued:", m.Status, m.Attempts)
	// Output:
	// 1 RETRY 503
	// 2 RETRY 503
	// 3 FAILED 503
	// requeued: PENDING 0
}

// With DeadLetterBlock, a dead letter holds its group: the messages behind
// it wait until an operator requeues it (it is then published first, so the
// group keeps its order) or cancels it.
func ExampleDeadLetterRule() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	store, _ := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	defer store.Close()
	_ = store.Migrate(ctx)

	ob := outbox.New[*sql.Tx](store, outbox.Options{})
	res, _ := ob.Enqueue(ctx,
		outbox.Message{Topic: "ledger", Group: "account-1", Payload: []byte(`{"n":1}`)},
		outbox.Message{Topic: "ledger", Group: "account-1", Payload: []byte(`{"n":2}`)},
		outbox.Message{Topic: "ledger", Group: "account-1", Payload: []byte(`{"n":3}`)})
	first := res[0].Message.ID

	var sent []string
	rejected := false
	pub := outbox.PublishEach(func(_ context.Context, m outbox.Message) outbox.Result {
		if m.ID == first && !rejected { // the first try of message 1 is refused for good
			rejected = true
			return outbox.Result{Err: outbox.Permanent("400", "rejected")}
		}
		sent = append(sent, string(m.Payload))
		return outbox.Result{}
	})
	p, err := outbox.NewProcessor(store, pub, outbox.Config{
		Topics:     []string{"ledger"},
		DeadLetter: outbox.DeadLetterRule{ByTopic: map[string]outbox.DeadLetterPolicy{"ledger": outbox.DeadLetterBlock}},
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- p.Run(runCtx) }()

	_ = p.WaitDrained(ctx)
	blocked, _ := store.MessageList(ctx, outbox.MessageListParams{BlocksGroup: true})
	fmt.Println("sent:", sent, "blocked groups:", len(blocked.Messages), blocked.Messages[0].Group)

	_, _ = store.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: first})
	_ = p.WaitDrained(ctx)
	fmt.Println("sent:", sent)
	stop()
	<-done
	// Output:
	// sent: [] blocked groups: 1 account-1
	// sent: [{"n":1} {"n":2} {"n":3}]
}

// A protobuf (or any binary) payload travels with its content type, byte
// for byte; the size limit is an Option, refused with a typed error.
func Example_contentType() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	store, _ := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	defer store.Close()
	_ = store.Migrate(ctx)

	ob := outbox.New[*sql.Tx](store, outbox.Options{MaxPayloadBytes: 64 << 10})
	body := []byte{0x0a, 0x02, 0x34, 0x32, 0x10, 0x00} // a protobuf encoding
	res, err := ob.Enqueue(ctx, outbox.Message{Topic: "orders", ContentType: "application/x-protobuf", Payload: body})
	if err != nil {
		panic(err)
	}
	m, _ := store.MessageGet(ctx, outbox.MessageGetParams{ID: res[0].Message.ID})
	fmt.Printf("%s %x json=%v\n", m.ContentType, m.Payload, m.IsJSON())

	_, err = ob.Enqueue(ctx, outbox.Message{Topic: "orders", ContentType: "application/octet-stream", Payload: make([]byte, 100<<10)})
	var tooLarge *outbox.PayloadTooLargeError
	fmt.Println(errors.As(err, &tooLarge), tooLarge.Limit)
	// Output:
	// application/x-protobuf 0a0234321000 json=false
	// true 65536
}
