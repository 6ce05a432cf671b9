package nats_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	outboxnats "github.com/outboxkit/outboxkit/transport/nats"
)

// TestPublishBinaryWithContentType: a protobuf payload reaches the stream
// byte for byte with its content type; a JSON one says application/json.
func TestPublishBinaryWithContentType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxnats.Config{JetStream: b.js, SubjectPrefix: b.prefix})
	bin := []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 0x80, 0x00}
	msgs := []outbox.Message{
		{ID: "bin-1", Topic: "orders", ContentType: "application/x-protobuf; messageType=acme.Order", Payload: bin},
		{ID: "json-1", Topic: "orders", Payload: []byte(`{"n":1}`)},
	}
	ctx := ctxT(t)
	res := p.Publish(ctx, msgs)
	want := []string{"application/x-protobuf; messageType=acme.Order", "application/json"}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
		_, seq, _ := strings.Cut(r.ProviderMessageID, ":")
		n, _ := strconv.ParseUint(seq, 10, 64)
		got, err := b.stream.GetMsg(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Data, msgs[i].Payload) || got.Header.Get(outboxnats.HeaderContentType) != want[i] {
			t.Fatalf("message %d stored as %x with content type %q; want %x, %q", i, got.Data, got.Header.Get(outboxnats.HeaderContentType), msgs[i].Payload, want[i])
		}
	}
}
