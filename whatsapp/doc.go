// Package whatsapp connects outboxkit to the WhatsApp Cloud API: a Publisher
// that sends outbox messages (templates and free-form text) through
// POST {base}/{version}/{phone-number-id}/messages, the map of Meta's error
// codes to retry decisions, 24-hour customer-service windows, per-tenant
// quotas and throughput limits, and the webhook http.Handler that verifies
// the subscription, checks X-Hub-Signature-256 and applies delivery receipts
// to any outbox.Store.
//
// # Wiring
//
//	creds := whatsapp.StaticCredentials{"org-1": {PhoneNumberID: "1065...", AccessToken: tok, AppSecret: sec, VerifyToken: vt}}
//	state := whatsapp.NewRedisState(redisClient, whatsapp.RedisOptions{})   // or NewSQLState, NewMemoryState
//	pub, _ := whatsapp.NewPublisher(whatsapp.Config{Credentials: creds, Windows: state, Quotas: state})
//	router := outbox.NewRouter().Handle("whatsapp", pub)
//	go outbox.Run(ctx, store, router, outbox.Config{})
//	hook, _ := whatsapp.NewWebhook(whatsapp.WebhookConfig{Credentials: creds, Receipts: store, Windows: state, Dedup: state})
//	mux.Handle("/webhooks/whatsapp", hook)
//
// # Message payloads
//
// A message with Topic "whatsapp" (any topic routed to the Publisher) carries
// a JSON payload in one of two shapes. The seed systems' shape:
//
//	{"to": "+33612345678", "templateCode": "order_confirmation",
//	 "payloadJson": {"language": "en", "components": [...]}}
//
// or, for free-form text, {"to": "...", "body": "Hello"}. The native Cloud
// API shape is also accepted and sent as is (after the phone number is
// normalised): {"to": "...", "type": "template", "template": {"name": ...,
// "language": {"code": "en_US"}, "components": [...]}}, {"to": "...", "type":
// "text", "text": {"body": "..."}}, or any other message type with its object.
// See Payload.
//
// # Errors and retries
//
// Every failure is an *outbox.PublishError whose Code is Meta's error code
// ("131047", "130429", ...) or one of this package's codes (CodeWindowClosed,
// CodeQuotaExceeded, ...). Classification follows ErrorMap, by the code in
// the response body, never by HTTP status unless the body has no code.
// Tokens and secrets never appear in errors, logs or stored messages.
//
// # Webhook
//
// Webhook answers Meta's GET verification per tenant and accepts POSTs only
// with a valid X-Hub-Signature-256 (HMAC-SHA256 of the raw body keyed with
// the tenant's app secret). The tenant is resolved from
// metadata.phone_number_id. Statuses become outbox receipts (idempotent,
// never a downgrade, never across tenants); inbound messages refresh the
// session window and reach WebhookConfig.OnInbound once per message ID.
package whatsapp
