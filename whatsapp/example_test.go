package whatsapp_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
	"github.com/outboxkit/outboxkit/whatsapp"
)

// Example wires the WhatsApp publisher and webhook to the embedded SQLite
// store: a template message is enqueued in the application's transaction,
// the processor sends it to the Cloud API (here a local stand-in answering
// like Meta), and Meta's signed delivery receipt, posted to the webhook on
// the application's mux, marks it DELIVERED.
func Example() {
	ctx := context.Background()

	// A stand-in for graph.facebook.com: it accepts every message.
	meta := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"messaging_product":"whatsapp","contacts":[{"input":"+16505551234","wa_id":"16505551234"}],"messages":[{"id":"wamid.HBgLMTY1MDU1NTEyMzQ"}]}`)
	}))
	defer meta.Close()

	dir, _ := os.MkdirTemp("", "whatsapp-example-")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// Per-tenant credentials (a host would read them from its secret store).
	creds := whatsapp.StaticCredentials{
		"org-1": {PhoneNumberID: "106540352242922", AccessToken: "EAAG...", AppSecret: "app_secret_123", VerifyToken: "my-verify-token"},
	}
	// Windows, quotas and inbound dedupe: in memory here; redisstate.State
	// or SQLState (or a Fallback of both) in production.
	state := whatsapp.NewMemoryState(whatsapp.QuotaOptions{})

	pub, err := whatsapp.NewPublisher(whatsapp.Config{Credentials: creds, BaseURL: meta.URL, Windows: state, Quotas: state})
	if err != nil {
		log.Fatal(err)
	}
	hook, err := whatsapp.NewWebhook(whatsapp.WebhookConfig{Credentials: creds, Receipts: store, Windows: state, Dedup: state})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/webhooks/whatsapp", hook)
	app := httptest.NewServer(mux)
	defer app.Close()

	// Enqueue in the application's own transaction.
	ob := outbox.New[*sql.Tx](store, outbox.Options{})
	err = store.InTx(ctx, func(tx *sql.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{
			Tenant: "org-1", Topic: "whatsapp", IdempotencyKey: "order-42-confirmation",
			Payload: []byte(`{"to":"+1 650 555 1234","templateCode":"order_confirmation",
				"payloadJson":{"language":"en","components":[{"type":"body","parameters":[{"type":"text","text":"42"}]}]}}`),
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// Run the processor until the message is sent.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, store, outbox.NewRouter().Handle("whatsapp", pub), outbox.Config{PollInterval: 20 * time.Millisecond})
	}()
	m := waitForStatus(ctx, store, outbox.StatusSent)
	stop()
	<-done
	fmt.Println(m.Status, m.ProviderMessageID)

	// Meta posts the signed delivery receipt.
	body := []byte(`{"object":"whatsapp_business_account","entry":[{"id":"WABA","changes":[{"field":"messages","value":{
		"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},
		"statuses":[{"id":"wamid.HBgLMTY1MDU1NTEyMzQ","status":"delivered","timestamp":"1739321024","recipient_id":"16505551234"}]}}]}]}`)
	req, _ := http.NewRequest(http.MethodPost, app.URL+"/webhooks/whatsapp", bytes.NewReader(body))
	req.Header.Set(whatsapp.SignatureHeader, whatsapp.Sign(body, "app_secret_123"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("webhook:", resp.StatusCode)

	m, _ = store.MessageGet(ctx, outbox.MessageGetParams{Tenant: "org-1", ID: m.ID})
	fmt.Println(m.Status, m.DeliveredAt.Unix())
	// Output:
	// SENT wamid.HBgLMTY1MDU1NTEyMzQ
	// webhook: 200
	// DELIVERED 1739321024
}

func waitForStatus(ctx context.Context, store outbox.Store, want outbox.Status) outbox.Message {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		page, err := store.MessageList(ctx, outbox.MessageListParams{Tenant: "org-1", Status: want})
		if err != nil {
			log.Fatal(err)
		}
		if len(page.Messages) > 0 {
			return page.Messages[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	log.Fatalf("no message reached %s", want)
	return outbox.Message{}
}

// ExampleVerifySignature checks a webhook body against its
// X-Hub-Signature-256 header, as the Webhook does.
func ExampleVerifySignature() {
	body := []byte(`{"object":"whatsapp_business_account","entry":[]}`)
	header := "sha256=02fe0c96d28c59ddb7cf81eff0ca05809b360ba73b63c28210b5906a0a107d1f"
	fmt.Println(whatsapp.VerifySignature(body, header, "app_secret_123"))
	fmt.Println(whatsapp.VerifySignature(body, header, "wrong"))
	// Output:
	// <nil>
	// whatsapp: webhook signature invalid
}

// ExampleErrorMap shows a host overriding one entry of the error map.
func ExampleErrorMap() {
	errs := whatsapp.DefaultErrorMap()
	fmt.Println(errs.Classify(131047, "").Retryable, errs.Classify(130429, "").RateLimit == whatsapp.ScopeTenant)
	// This host refreshes tokens itself: retry 190 a minute later.
	errs.Set(whatsapp.ErrorSpec{Code: 190, Description: "token expired; refreshed by the host", Retryable: true, RetryAfter: time.Minute})
	fmt.Println(errs.Classify(190, "").Retryable)
	// Output:
	// false true
	// true
}
