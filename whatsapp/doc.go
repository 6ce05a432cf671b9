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
//	sqlState, _ := whatsapp.NewSQLState(db, whatsapp.SQLOptions{Dialect: whatsapp.DialectPostgres})
//	state := &whatsapp.Fallback{ // Redis first; the SQL tables while Redis is down
//		Primary:   redisstate.New(redisClient, redisstate.Options{}), // package whatsapp/redisstate
//		Secondary: sqlState,
//	}
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
// See Payload. A message whose ContentType is not JSON fails permanently
// with outbox.CodeNotJSON ("payload_not_json") before anything is sent.
//
// # Errors and retries
//
// Every failure carries a Code, Meta's error code ("131047", "130429", ...)
// or one of this package's codes (CodeWindowClosed, CodeQuotaExceeded, ...),
// stored as the message's LastError. Classification follows ErrorMap, by the
// code in the response body, never by HTTP status unless the body has no
// code. Tokens and secrets never appear in errors, logs or stored messages.
//
// A failure is one of three kinds:
//   - permanent (an *outbox.PublishError): the message is dead-lettered at
//     once (invalid number, template errors, window closed, ...);
//   - retryable (an *outbox.PublishError): the attempt counts, the message
//     is retried with backoff (or Meta's Retry-After) and dead-lettered
//     after MaxAttempts (5xx answers, 131000, unknown codes, timeouts);
//   - deferred (an *outbox.DeferError, see outbox.Defer): the message goes
//     back to PENDING, due when the wait ends, WITHOUT an attempt counted,
//     so it is never dead-lettered for it, however long it waits. This is
//     what happens when the tenant's quota is used up (CodeQuotaExceeded,
//     until the quota window resets), when the tenant or the recipient is
//     throttled or the business number's throughput limit is reached
//     (CodeThrottled, until the throttle ends), and when Meta answers a
//     rate limit (every ErrorMap entry with a RateLimit scope: 4, 80007,
//     130429, 131048, 131056, 133016, ...; and HTTP 429 without a code),
//     which also throttles the tenant (or, for 131056, the recipient).
//     A deferral is not an attempt; the message's LastError says why it
//     waits. In an ordered group a deferred message holds back the group's
//     later messages. A host that wants a rate-limit code to count as an
//     attempt instead (so it ends in the dead letter) overrides its entry
//     with ErrorMap.Set and RateLimit: ScopeNone, Retryable: true.
//
// # Webhook
//
// Webhook answers Meta's GET verification per tenant and accepts POSTs only
// with a valid X-Hub-Signature-256 (HMAC-SHA256 of the raw body keyed with
// the tenant's app secret). The tenant is resolved from
// metadata.phone_number_id. Statuses become outbox receipts (idempotent,
// never a downgrade, never across tenants); inbound messages refresh the
// session window and reach WebhookConfig.OnInbound once per message ID.
//
// Meta can deliver a status before the processor has recorded the send
// (the message is still PROCESSING, the store has no wamid yet). The
// Publisher sends the outbox message ID as biz_opaque_callback_data, so
// when a status's wamid is unknown the webhook looks that ID up in the same
// tenant: if the message is PENDING or PROCESSING (its send in flight or
// its outcome not yet recorded), the webhook changes nothing for that
// status, logs it at info level and answers 503 once the rest of the
// notification is applied; Meta redelivers the notification later, with
// backoff, and it applies once SENT is recorded. A status whose wamid and
// callback data name no message in flight is acknowledged (200) and logged.
// The lookup is tenant-scoped: callback data never reaches another tenant's
// message.
package whatsapp
