package whatsapp

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestNonJSONContentTypeFailsPermanently: the Cloud API takes JSON only. A
// message whose content type is not JSON is dead-lettered with
// outbox.CodeNotJSON before any call to Meta, even when its bytes are a
// valid send request; a "+json" content type is sent.
func TestNonJSONContentTypeFailsPermanently(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	p := newTestPublisher(t, api, nil)
	proto := msg("org-1", templatePayload)
	proto.ContentType = "application/x-protobuf"
	res := p.Publish(context.Background(), []outbox.Message{proto})
	var pe *outbox.PublishError
	if !errors.As(res[0].Err, &pe) || pe.Code != outbox.CodeNotJSON || !pe.Permanent {
		t.Fatalf("protobuf message: %v; want a permanent %s", res[0].Err, outbox.CodeNotJSON)
	}
	if n := len(api.requests()); n != 0 {
		t.Fatalf("%d requests to the Cloud API for a non-JSON message", n)
	}
	js := msg("org-1", templatePayload)
	js.ContentType = "application/vnd.acme.send+json; charset=utf-8"
	if res := p.Publish(context.Background(), []outbox.Message{js}); res[0].Err != nil {
		t.Fatalf("+json message: %v", res[0].Err)
	}
	if n := len(api.requests()); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}
