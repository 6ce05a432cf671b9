package flowcatalyst_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/outbox"
)

// Publishing a batch to FlowCatalyst with an OAuth2 client-credentials
// token: one item is refused by the platform and is not retried.
func Example() {
	// A fake FlowCatalyst; in production BaseURL is your platform's URL.
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	tokenURL := srv.EnableOAuth("order-service", "client-secret", time.Hour)
	srv.OnItem(func(_ *flowcatalysttest.Request, i int, _ json.RawMessage) flowcatalyst.ItemResult {
		if i == 1 {
			return flowcatalyst.ItemResult{Status: flowcatalyst.ItemBadRequest, Error: "source is required"}
		}
		return flowcatalyst.ItemResult{}
	})

	tokens, err := flowcatalyst.NewClientCredentials(flowcatalyst.ClientCredentialsConfig{
		TokenURL: tokenURL, ClientID: "order-service", ClientSecret: "client-secret",
	})
	if err != nil {
		panic(err)
	}
	pub, err := flowcatalyst.New(flowcatalyst.Config{
		BaseURL: srv.URL,
		API:     flowcatalyst.CurrentAPI,
		Token:   tokens,
	})
	if err != nil {
		panic(err)
	}

	results := pub.Publish(context.Background(), []outbox.Message{
		{Topic: flowcatalyst.TopicEvent, Group: "order-42", Payload: json.RawMessage(`{"type":"order.created","source":"shop","data":{"id":42}}`)},
		{Topic: flowcatalyst.TopicEvent, Group: "order-42", Payload: json.RawMessage(`{"type":"order.paid","data":{"id":42}}`)},
	})
	for i, r := range results {
		if r.Err != nil {
			fmt.Printf("message %d: retryable=%v: %v\n", i, outbox.IsRetryable(r.Err), r.Err)
			continue
		}
		fmt.Printf("message %d: sent as %s\n", i, r.ProviderMessageID)
	}
	fmt.Println("stored events:", len(srv.Items(flowcatalyst.CurrentAPI.EventsPath)))
	// Output:
	// message 0: sent as event_000001
	// message 1: retryable=false: publish failed (permanent, code BAD_REQUEST): item BAD_REQUEST: source is required
	// stored events: 1
}

// Generating ids for rows of seed 004's outbox tables.
func ExampleNewTSID() {
	id := flowcatalyst.NewTSID()
	parsed, err := flowcatalyst.ParseTSID(id.String())
	fmt.Println(len(id.String()), parsed == id, err)
	// Output: 13 true <nil>
}
