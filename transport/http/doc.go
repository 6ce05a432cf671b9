// Package http publishes outbox messages to a generic JSON webhook.
//
// A Publisher POSTs each message's Payload (or, with Config.Batch, a JSON
// array of Envelope) to one URL, with the message ID as Idempotency-Key,
// the tenant, topic and group in X-Outbox-* headers, and optionally an
// HMAC-SHA256 signature of the body under a per-tenant secret. It maps 2xx
// to sent, 408, 429 and 5xx to retryable (honouring Retry-After) and other
// 4xx to permanent.
//
//	pub, err := outboxhttp.New(outboxhttp.Config{
//		URL:     "https://hooks.example.com/outbox",
//		Headers: http.Header{"Authorization": {"Bearer " + token}},
//		Secret: func(ctx context.Context, tenant string) ([]byte, error) {
//			return secrets.Get(ctx, "webhook/"+tenant)
//		},
//	})
//	...
//	proc, err := outbox.NewProcessor(store, pub, outbox.Config{Topics: []string{"orders"}})
//
// Receivers check the signature with Verify. See Publisher for the
// outcomes, ordered groups and cancellation.
package http
