package kafka_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/transport/kafka"
)

// TestPublishBinaryWithContentType: a protobuf payload becomes the record's
// value byte for byte, with its content type in HeaderContentType; a JSON
// one says application/json.
func TestPublishBinaryWithContentType(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.events"))
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c), TopicPrefix: "outbox."})
	msgs := []outbox.Message{
		{ID: "bin", Topic: "events", ContentType: "application/x-protobuf", Payload: []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 0x80}},
		{ID: "json", Topic: "events", Payload: []byte(`{"n":1}`)},
	}
	for i, r := range pub.Publish(context.Background(), msgs) {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	want := map[string]string{"bin": "application/x-protobuf", "json": "application/json"}
	for _, r := range readAll(t, c, len(msgs), "outbox.events") {
		id, _ := header(r, kafka.HeaderID)
		ct, _ := header(r, kafka.HeaderContentType)
		var m outbox.Message
		for _, x := range msgs {
			if x.ID == id {
				m = x
			}
		}
		if !bytes.Equal(r.Value, m.Payload) || ct != want[id] {
			t.Fatalf("%s: value %x content type %q; want %x, %q", id, r.Value, ct, m.Payload, want[id])
		}
	}
}
