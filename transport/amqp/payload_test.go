package amqp_test

import (
	"bytes"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	outboxamqp "github.com/outboxkit/outboxkit/transport/amqp"
)

// TestPublishBinaryWithContentType: a protobuf payload reaches the queue
// byte for byte with its content type in the content_type property; a JSON
// one says application/json.
func TestPublishBinaryWithContentType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxamqp.Config{URL: b.url, Exchange: b.exchange})
	msgs := []outbox.Message{
		{ID: "bin-1", Topic: "orders", ContentType: "application/x-protobuf", Payload: []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 0x80}},
		{ID: "json-1", Topic: "orders", Payload: []byte(`{"n":1}`)},
	}
	for i, r := range p.Publish(ctxT(t), msgs) {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	want := map[string]string{"bin-1": "application/x-protobuf", "json-1": "application/json"}
	for _, d := range b.receive(t, len(msgs)) {
		var m outbox.Message
		for _, x := range msgs {
			if x.ID == d.MessageId {
				m = x
			}
		}
		if !bytes.Equal(d.Body, m.Payload) || d.ContentType != want[d.MessageId] {
			t.Fatalf("%s: body %x content type %q; want %x, %q", d.MessageId, d.Body, d.ContentType, m.Payload, want[d.MessageId])
		}
	}
}
