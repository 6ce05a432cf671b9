package outboxotel_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxkit/outboxkit/outbox"
	outboxotel "github.com/outboxkit/outboxkit/outbox/otel"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// Wire one Telemetry into the enqueue path and the processor: the publish
// span continues the trace of the request that enqueued the message.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outboxkit-otel-")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		panic(err)
	}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tel, err := outboxotel.New(outboxotel.Config{TracerProvider: tp, Store: st})
	if err != nil {
		panic(err)
	}
	defer tel.Close()

	// The request that enqueues, in its own span.
	reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders")
	ob := outbox.New[*sql.Tx](st, outbox.Options{Observer: tel, Headers: tel})
	if _, err := ob.Enqueue(reqCtx, outbox.Message{Topic: "orders", Payload: []byte(`{"order":1}`)}); err != nil {
		panic(err)
	}
	req.End()

	published := make(chan string, 1)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		for _, m := range msgs {
			published <- m.Headers["traceparent"] // what a broker would carry on
		}
		return make([]outbox.Result, len(msgs))
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, st, tel.Publisher(pub), outbox.Config{
			Topics: []string{"orders"}, Observer: tel, PollInterval: 10 * time.Millisecond,
		})
	}()
	var traceparent string
	select {
	case traceparent = <-published:
	case err := <-done:
		panic(err)
	}
	stop()
	<-done

	for _, s := range spans.GetSpans() {
		if s.Name == "publish orders" {
			fmt.Println("same trace as the request:", s.SpanContext.TraceID() == req.SpanContext().TraceID())
			fmt.Println("child of the request span:", s.Parent.SpanID() == req.SpanContext().SpanID())
			fmt.Println("carried on:", traceparent == fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID()))
		}
	}
	// Output:
	// same trace as the request: true
	// child of the request span: true
	// carried on: true
}
