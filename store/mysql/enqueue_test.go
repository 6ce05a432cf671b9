package mysql_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// TestEnqueueBatchKeys: a call of several messages (inserted in multi-row
// statements) returns, for a key stored before or repeated within the
// call, the first message with Existed, and new messages with their seqs
// in the call's order.
func TestEnqueueBatchKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mysql.Options{})
	msg := func(key string) outbox.Message {
		return outbox.Message{Tenant: "t", Topic: "x", Group: "g", IdempotencyKey: key, Payload: []byte(`{"k":"` + key + `"}`)}
	}
	first, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{msg("a"), msg("b"), msg("a")}})
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Existed || first[1].Existed || !first[2].Existed {
		t.Fatalf("existed: %v %v %v, want false false true", first[0].Existed, first[1].Existed, first[2].Existed)
	}
	if first[2].Message.ID != first[0].Message.ID || first[0].Message.Seq >= first[1].Message.Seq {
		t.Fatalf("repeat within the call: %+v", first)
	}
	again, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{msg("c"), msg("b")}})
	if err != nil {
		t.Fatal(err)
	}
	if again[0].Existed || !again[1].Existed || again[1].Message.ID != first[1].Message.ID || again[1].Message.Seq != first[1].Message.Seq {
		t.Fatalf("second call: %+v", again)
	}
	if again[0].Message.Seq <= first[1].Message.Seq {
		t.Fatalf("new message's seq %d not after %d", again[0].Message.Seq, first[1].Message.Seq)
	}
	for _, e := range append(first, again...) {
		got, err := st.MessageGet(ctx, outbox.MessageGetParams{Tenant: "t", ID: e.Message.ID})
		if err != nil || got.Seq != e.Message.Seq || got.IdempotencyKey != e.Message.IdempotencyKey {
			t.Fatalf("stored %+v, %v; returned %+v", got, err, e.Message)
		}
	}
}

// TestEnqueueBatchChunks: a call larger than one statement takes (1,000
// rows, about 4 MiB of payload; a larger message goes alone) and spread
// over more groups than one lock statement takes is stored whole, with
// seqs in the call's order.
func TestEnqueueBatchChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mysql.Options{})
	big := bytes.Repeat([]byte("x"), 3<<20)
	var msgs []outbox.Message
	for i := range 2500 {
		m := outbox.Message{Topic: "x", Group: fmt.Sprintf("g%d", i%1200), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
		if i%700 == 5 { // four 3 MiB messages among the small ones
			m.ContentType, m.Payload = "application/octet-stream", big
		}
		msgs = append(msgs, m)
	}
	res, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: msgs, MaxPayloadBytes: st.MaxPayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range res {
		if e.Existed || e.Message.Seq == 0 || i > 0 && e.Message.Seq <= res[i-1].Message.Seq {
			t.Fatalf("message %d: %+v", i, e)
		}
	}
	n, err := st.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil {
		t.Fatal(err)
	}
	if n[outbox.StatusPending] != 2500 {
		t.Fatalf("stored %d pending, want 2500", n[outbox.StatusPending])
	}
	got, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: res[705].Message.ID})
	if err != nil || !bytes.Equal(got.Payload, big) {
		t.Fatalf("large payload: %d bytes, %v", len(got.Payload), err)
	}
}
