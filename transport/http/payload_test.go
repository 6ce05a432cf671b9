package http_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	outboxhttp "github.com/outboxkit/outboxkit/transport/http"
)

// TestBinaryPayloads: one request per message sends the bytes exactly with
// the message's content type; a batch embeds JSON payloads and carries the
// others as base64 with their content type.
func TestBinaryPayloads(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ string) { _, _ = io.WriteString(w, `{}`) })
	bin := []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 0x80}
	msgs := []outbox.Message{
		{ID: "bin", Topic: "orders", ContentType: "application/x-protobuf", Payload: bin},
		{ID: "ce", Topic: "orders", ContentType: "application/cloudevents+json", Payload: []byte(`{"id":"1"}`)},
		{ID: "plain", Topic: "orders", Payload: []byte(`{"n":1}`)},
	}
	for i, r := range newPublisher(t, outboxhttp.Config{URL: s.URL}).Publish(context.Background(), msgs) {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	want := []string{"application/x-protobuf", "application/cloudevents+json", "application/json"}
	for i, r := range s.requests() {
		if r.body != string(msgs[i].Payload) || r.header.Get("Content-Type") != want[i] {
			t.Fatalf("request %d: body %x content type %q; want %x, %q", i, r.body, r.header.Get("Content-Type"), msgs[i].Payload, want[i])
		}
	}

	for i, r := range newPublisher(t, outboxhttp.Config{URL: s.URL, Batch: true}).Publish(context.Background(), msgs) {
		if r.Err != nil {
			t.Fatalf("batch message %d: %v", i, r.Err)
		}
	}
	reqs := s.requests()
	batch := reqs[len(reqs)-1]
	if batch.header.Get("Content-Type") != "application/json" {
		t.Fatalf("batch Content-Type %q", batch.header.Get("Content-Type"))
	}
	if !strings.Contains(batch.body, `"payload":{"id":"1"}`) {
		t.Fatalf("the JSON payload is not embedded: %s", batch.body)
	}
	var envs []outboxhttp.Envelope
	if err := json.Unmarshal([]byte(batch.body), &envs); err != nil {
		t.Fatal(err)
	}
	if len(envs) != 3 || envs[0].ContentType != "application/x-protobuf" || !bytes.Equal(envs[0].PayloadBase64, bin) || string(envs[0].Payload) != "null" ||
		envs[1].ContentType != "application/cloudevents+json" || string(envs[1].Payload) != `{"id":"1"}` || envs[1].PayloadBase64 != nil ||
		envs[2].ContentType != "" || string(envs[2].Payload) != `{"n":1}` {
		t.Fatalf("batch %s", batch.body)
	}
}
