package storetest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
)

// payloadCases are payloads every store must keep byte for byte, with their
// content type.
func payloadCases() []outbox.Message {
	return []outbox.Message{
		// A protobuf encoding: NUL bytes, bytes that are not UTF-8.
		{Topic: "t", ContentType: "application/x-protobuf; messageType=acme.OrderPlaced",
			Payload: []byte{0x0a, 0x05, 'o', 'r', 'd', 'e', 'r', 0x10, 0x00, 0x1a, 0x03, 0xff, 0xfe, 0x80, 0x00}},
		// Every byte value.
		{Topic: "t", ContentType: "application/octet-stream", Payload: func() []byte {
			b := make([]byte, 512)
			for i := range b {
				b[i] = byte(i)
			}
			return b
		}()},
		// An empty protobuf message encodes to nothing.
		{Topic: "t", ContentType: "application/x-protobuf", Payload: []byte{}},
		// Text that is not JSON.
		{Topic: "t", ContentType: "text/plain; charset=utf-8", Payload: []byte("plain text, not JSON: {")},
		// JSON kinds: spacing and key order kept as given.
		{Topic: "t", ContentType: "application/cloudevents+json", Payload: []byte(`{"specversion":"1.0", "type":"order.placed",  "id":"1"}`)},
		{Topic: "t", Payload: []byte(`{"b": 1,   "a": [1, 2]}`)},
	}
}

func testPayload[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("BytesAndContentTypeRoundTrip", func(t *testing.T) {
		need(t, h, CapBinaryPayloads)
		e := setup(t, h)
		in := payloadCases()
		in[0].IdempotencyKey = "protobuf-1"
		check := func(where string, got []outbox.Message) {
			t.Helper()
			byID := map[string]outbox.Message{}
			for _, m := range got {
				byID[m.ID] = m
			}
			for i, m := range in {
				g, ok := byID[m.ID]
				if !ok {
					t.Fatalf("%s: message %d (%s) missing", where, i, m.ID)
				}
				if !bytes.Equal(g.Payload, m.Payload) || g.ContentType != m.ContentType {
					t.Fatalf("%s: message %d: payload %q content type %q; want %q, %q", where, i, g.Payload, g.ContentType, m.Payload, m.ContentType)
				}
			}
		}
		tx := e.begin()
		res, err := e.ob.EnqueueTx(e.ctx, tx, in...)
		if err != nil {
			t.Fatalf("EnqueueTx: %v", err)
		}
		e.commit(tx)
		returned := make([]outbox.Message, len(res))
		for i := range res {
			in[i].ID = res[i].Message.ID
			returned[i] = res[i].Message
		}
		check("EnqueueTx's result", returned)
		got := make([]outbox.Message, len(in))
		for i := range in {
			got[i] = e.get("", in[i].ID)
		}
		check("MessageGet", got)
		check("MessageList", e.list(outbox.MessageListParams{}).Messages)
		check("MessageClaim", e.claim("p", 100, e.t0))
		if !h.lacks(CapIdempotency) {
			// A repeat returns the stored bytes, not the repeat's.
			r, err := e.ob.Enqueue(e.ctx, outbox.Message{Topic: "t", IdempotencyKey: "protobuf-1", Payload: []byte(`{}`)})
			if err != nil || !r[0].Existed {
				t.Fatalf("repeat: %+v, %v; want Existed", r, err)
			}
			check("a repeat's result", append([]outbox.Message{r[0].Message}, returned[1:]...))
		}
	})

	t.Run("LimitRefusedBeforeSQL", func(t *testing.T) {
		need(t, h, CapBinaryPayloads)
		e := setup(t, h)
		tx := e.begin()
		ob := outbox.New[TTx](e.b.Enqueuer, outbox.Options{MaxPayloadBytes: 100})
		_, err := ob.EnqueueTx(e.ctx, tx, outbox.Message{Topic: "t", ContentType: "application/octet-stream", Payload: make([]byte, 101)})
		var tl *outbox.PayloadTooLargeError
		if !errors.As(err, &tl) || tl.Limit != 100 || tl.Size != 101 || !errors.Is(err, outbox.ErrInvalidInput) {
			t.Fatalf("101 bytes over a limit of 100: %v; want a *outbox.PayloadTooLargeError", err)
		}
		e.usable(tx)
		// The default limit, 1 MiB, holds in every store.
		big := bytes.Repeat([]byte{0, 1, 0xff}, outbox.DefaultMaxPayloadBytes/3+1)[:outbox.DefaultMaxPayloadBytes]
		_, err = e.ob.EnqueueTx(e.ctx, tx, outbox.Message{Topic: "t", ContentType: "application/octet-stream", Payload: append(big, 0)})
		if !errors.As(err, &tl) || tl.Limit != outbox.DefaultMaxPayloadBytes {
			t.Fatalf("1 MiB + 1 under the default limit: %v; want a *outbox.PayloadTooLargeError", err)
		}
		e.usable(tx)
		res, err := e.ob.EnqueueTx(e.ctx, tx, outbox.Message{Topic: "t", ContentType: "application/octet-stream", Payload: big})
		if err != nil {
			t.Fatalf("EnqueueTx of 1 MiB: %v", err)
		}
		e.commit(tx)
		if got := e.get("", res[0].Message.ID); !bytes.Equal(got.Payload, big) {
			t.Fatalf("a 1 MiB payload came back as %d bytes, different", len(got.Payload))
		}
	})

	t.Run("StoreCeiling", func(t *testing.T) {
		e := setup(t, h)
		lim, ok := e.b.Enqueuer.(outbox.PayloadLimiter)
		if !ok {
			if lim, ok = e.s.(outbox.PayloadLimiter); !ok {
				t.Skip("storetest: the store declares no payload ceiling (outbox.PayloadLimiter)")
			}
		}
		ceiling := lim.MaxPayloadBytes()
		if ceiling < outbox.DefaultMaxPayloadBytes {
			t.Fatalf("the store's ceiling %d is below the default limit %d", ceiling, outbox.DefaultMaxPayloadBytes)
		}
		if err := outbox.New[TTx](e.b.Enqueuer, outbox.Options{MaxPayloadBytes: ceiling + 1}).Err(); err == nil {
			t.Fatal("an Outbox with a limit above the store's ceiling reports no error")
		}
		ob := outbox.New[TTx](e.b.Enqueuer, outbox.Options{MaxPayloadBytes: ceiling})
		if err := ob.Err(); err != nil {
			t.Fatalf("an Outbox with the store's ceiling as its limit: %v", err)
		}
		payload := make([]byte, ceiling)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		tx := e.begin()
		res, err := ob.EnqueueTx(e.ctx, tx, outbox.Message{Topic: "t", ContentType: "application/octet-stream", Payload: payload})
		if err != nil {
			t.Fatalf("EnqueueTx of a payload at the store's ceiling (%d bytes): %v", ceiling, err)
		}
		// Called directly, the store refuses more than its ceiling itself.
		over := res[0].Message
		over.ID = outbox.NewID(e.t0)
		over.IdempotencyKey, over.Payload = over.ID, append(payload, 1)
		_, err = e.b.Enqueuer.MessageEnqueueTx(e.ctx, tx, outbox.MessageEnqueueParams{Messages: []outbox.Message{over}, Now: e.t0, MaxPayloadBytes: 2 * ceiling})
		var tl *outbox.PayloadTooLargeError
		if !errors.As(err, &tl) || !tl.StoreCeiling || tl.Limit != ceiling {
			t.Fatalf("MessageEnqueueTx above the store's ceiling: %v; want a *outbox.PayloadTooLargeError with StoreCeiling", err)
		}
		e.usable(tx)
		e.commit(tx)
		got := e.get("", res[0].Message.ID)
		if !bytes.Equal(got.Payload, payload) {
			t.Fatalf("a payload of %d bytes came back as %d bytes, different", ceiling, len(got.Payload))
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusPending: 1})
	})
}
