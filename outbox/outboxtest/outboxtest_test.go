package outboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

func TestRequireEnqueuedTxSeesUncommittedMessages(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "o.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.EnqueueTx(ctx, tx,
		outbox.Message{Tenant: "a", Topic: "orders", Payload: []byte(`{"id": 1, "total": 5}`)},
		outbox.Message{Tenant: "a", Topic: "audit", Payload: []byte(`{}`)},
	); err != nil {
		t.Fatal(err)
	}
	got := outboxtest.RequireEnqueuedTx(t, st, tx, outboxtest.Want{Tenant: "a", Topic: "orders", Payload: []byte(`{"total":5,"id":1}`), Count: 1})
	if got[0].Topic != "orders" {
		t.Fatalf("got %+v", got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireEnqueued(t, st, outboxtest.Want{Tenant: "a", Count: 2})

	rec := &outboxtest.Recorder{}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, st, rec, outbox.Config{AllTopics: true, PollInterval: 5 * time.Millisecond})
	}()
	c := outboxtest.WaitDrained(t, st, "a", 10*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c[outbox.StatusSent] != 2 || len(rec.Sent()) != 2 {
		t.Fatalf("counts %v, sent %v", c, rec.Sent())
	}

	// A binary payload matches byte for byte, and by content type.
	if _, err := ob.Enqueue(ctx, outbox.Message{Tenant: "b", Topic: "events", ContentType: "application/x-protobuf", Payload: []byte{0x0a, 0x00, 0xff}}); err != nil {
		t.Fatal(err)
	}
	got = outboxtest.RequireEnqueued(t, st, outboxtest.Want{Tenant: "b", ContentType: "application/x-protobuf", Payload: []byte{0x0a, 0x00, 0xff}, Count: 1})
	if got[0].Topic != "events" {
		t.Fatalf("got %+v", got)
	}
}

func TestRecorderStopsAGroupAtItsFirstFailure(t *testing.T) {
	t.Parallel()
	rec := &outboxtest.Recorder{Func: func(m outbox.Message) outbox.Result {
		if m.ID == "1" {
			return outbox.Result{Err: outbox.Retryable("x", "down")}
		}
		return outbox.Result{}
	}}
	res := rec.Publish(context.Background(), []outbox.Message{{ID: "1", Group: "g"}, {ID: "2", Group: "g"}, {ID: "3"}})
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) || res[2].Err != nil {
		t.Fatalf("results %+v", res)
	}
	if pubs := rec.Publications(); len(pubs) != 2 || pubs[0].Message.ID != "1" || pubs[1].Message.ID != "3" {
		t.Fatalf("publications %+v", pubs)
	}
	if sent := rec.Sent(); len(sent) != 1 || sent[0] != "3" {
		t.Fatalf("sent %v", sent)
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	var c outboxtest.Clock
	t0 := c.Now()
	c.Advance(time.Minute)
	if c.Now().Sub(t0) != time.Minute {
		t.Fatal("Advance")
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c.Set(at)
	if !c.Now().Equal(at) || !outboxtest.NewClock(at).Now().Equal(at) {
		t.Fatal("Set/NewClock")
	}
}
