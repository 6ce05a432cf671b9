package service_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/outboxkit/outboxkit/examples/messaging-service/client"
	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
)

// testGeneratedClient: the client generated from the OpenAPI document
// (examples/messaging-service/client) works against the server: create, the
// idempotent replay (200), read, the attempt history, an error's typed
// body, and Meta's verification on an organisation's URL.
func (e *env) testGeneratedClient(t *testing.T) {
	e.t = t
	const d = 308
	e.consent("org-1", d, "GRANTED")
	c, err := client.NewClientWithResponses(e.ts.URL, client.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+key1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	key, subject, tmpl := "client-308", "Generated", "order_confirmation"
	body := client.CreateMessage{DossierId: d, Channel: client.CreateMessageChannelWHATSAPP, To: "+33600000312",
		TemplateCode: &tmpl, Subject: &subject, PayloadJson: &map[string]any{"language": "en"}}
	created, err := c.CreateMessageWithResponse(ctx, &client.CreateMessageParams{XOrgId: "org-1", IdempotencyKey: &key}, body)
	if err != nil || created.JSON201 == nil {
		t.Fatalf("create: %v %d %s", err, created.StatusCode(), created.Body)
	}
	id := created.JSON201.Id
	again, err := c.CreateMessageWithResponse(ctx, &client.CreateMessageParams{XOrgId: "org-1", IdempotencyKey: &key}, body)
	if err != nil || again.JSON200 == nil || *again.JSON200.Id != *id {
		t.Fatalf("replay: %v %d %s", err, again.StatusCode(), again.Body)
	}
	e.waitStatus("org-1", *id, "DELIVERED")
	got, err := c.GetMessageWithResponse(ctx, *id, &client.GetMessageParams{XOrgId: "org-1"})
	if err != nil || got.JSON200 == nil || got.JSON200.Subject == nil || *got.JSON200.Subject != subject {
		t.Fatalf("get: %v %d %s", err, got.StatusCode(), got.Body)
	}
	as, err := c.ListMessageAttemptsWithResponse(ctx, *id, &client.ListMessageAttemptsParams{XOrgId: "org-1"})
	if err != nil || as.JSON200 == nil || len(*as.JSON200) != 1 || (*as.JSON200)[0].Status != client.AttemptStatusSUCCESS {
		t.Fatalf("attempts: %v %d %s", err, as.StatusCode(), as.Body)
	}
	missing, err := c.GetMessageWithResponse(ctx, "nope", &client.GetMessageParams{XOrgId: "org-1"})
	if err != nil || missing.JSON404 == nil || missing.JSON404.Error.Code != "not_found" {
		t.Fatalf("missing message: %v %d %s", err, missing.StatusCode(), missing.Body)
	}
	mode, token, challenge := "subscribe", "verify-org-1", "4242"
	v, err := c.VerifyOrgWebhookWithResponse(ctx, "org-1", &client.VerifyOrgWebhookParams{HubMode: &mode, HubVerifyToken: &token, HubChallenge: &challenge})
	if err != nil || v.StatusCode() != 200 || string(v.Body) != challenge {
		t.Fatalf("verification: %v %d %s", err, v.StatusCode(), v.Body)
	}
	_ = service.OrgWebhookPath
}
