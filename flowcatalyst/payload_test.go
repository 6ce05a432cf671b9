package flowcatalyst_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/outbox"
)

// TestNonJSONContentTypeFailsPermanently: FlowCatalyst takes JSON items
// only. A message whose content type is not JSON is dead-lettered with
// outbox.CodeNotJSON and never sent, even when its bytes parse as JSON; a
// "+json" content type is sent.
func TestNonJSONContentTypeFailsPermanently(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL})
	proto := msg(flowcatalyst.TopicEvent, "", 1)
	proto.ContentType = "application/x-protobuf"
	ce := msg(flowcatalyst.TopicEvent, "", 2)
	ce.ContentType = "application/cloudevents+json"
	res := pub.Publish(context.Background(), []outbox.Message{proto, ce})
	pe := publishError(t, res[0].Err)
	if pe.Code != outbox.CodeNotJSON || !pe.Permanent {
		t.Fatalf("protobuf message: %v; want a permanent %s", res[0].Err, outbox.CodeNotJSON)
	}
	if res[1].Err != nil {
		t.Fatalf("cloudevents+json message: %v", res[1].Err)
	}
	if got := srv.Items("/api/events/batch"); len(got) != 1 || itemN(t, got[0]) != 2 {
		t.Fatalf("items sent: %s; want only the JSON one", got)
	}
}
