package http_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/outboxkit/outboxkit/outbox"
	outboxhttp "github.com/outboxkit/outboxkit/transport/http"
)

// POST signed messages to a webhook; the receiver verifies the signature.
func Example() {
	secret := []byte("tenant-acme-secret")
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !outboxhttp.Verify(secret, body, r.Header.Get("X-Outbox-Signature")) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		fmt.Println("received", r.Header.Get("Idempotency-Key"), r.Header.Get("X-Outbox-Tenant"), string(body))
	}))
	defer hook.Close()

	pub, err := outboxhttp.New(outboxhttp.Config{
		URL: hook.URL,
		Secret: func(_ context.Context, tenant string) ([]byte, error) {
			return secret, nil // look the tenant's secret up in a vault
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	res := pub.Publish(context.Background(), []outbox.Message{{
		ID: "01J0000000000000000000000A", Tenant: "acme", Topic: "orders", Payload: []byte(`{"order":42}`),
	}})
	fmt.Println("error:", res[0].Err)
	// Output:
	// received 01J0000000000000000000000A acme {"order":42}
	// error: <nil>
}
