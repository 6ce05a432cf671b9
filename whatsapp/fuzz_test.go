package whatsapp

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
)

func FuzzParseNotification(f *testing.F) {
	f.Add([]byte(`{"object":"whatsapp_business_account","entry":[]}`))
	f.Add(statusBody(testPhoneID, st("wamid.1", "delivered", 1739321024)))
	f.Add(inboundBody(testPhoneID, inboundMsg("wamid.2", 1749416383)))
	f.Add([]byte(`{"entry":[{"changes":[{"value":{"statuses":[{"id":"x","timestamp":12,"errors":[{"code":"x"}]}]}}]}]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"entry":[{"changes":[{"value":{"messages":[{"timestamp":"99999999999999999999"}]}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := ParseNotification(body)
		if err != nil {
			if n != nil {
				t.Fatal("a notification with an error")
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("invalid JSON accepted: %q", body)
		}
		for _, e := range n.Entry {
			for _, c := range e.Changes {
				for _, s := range c.Value.Statuses {
					_ = s.Timestamp.Time()
					_, _ = deliveryStatus(s.Status)
				}
				for _, m := range c.Value.Messages {
					if m.Timestamp < 0 {
						t.Fatalf("negative timestamp %d", m.Timestamp)
					}
				}
			}
		}
	})
}

func FuzzVerifySignature(f *testing.F) {
	body := []byte(`{"object":"whatsapp_business_account","entry":[]}`)
	f.Add(body, "sha256=02fe0c96d28c59ddb7cf81eff0ca05809b360ba73b63c28210b5906a0a107d1f", "app_secret_123")
	f.Add([]byte("test"), "sha256=0329a06b62cd16b33eb6792be8c60b158d89a2ee3a876fce9a881ebb488c0914", "secret")
	f.Add([]byte(""), "", "")
	f.Add([]byte("x"), "sha256=", "s")
	f.Add([]byte("x"), "sha1=abcd", "s")
	f.Fuzz(func(t *testing.T, body []byte, header, secret string) {
		err := VerifySignature(body, header, secret)
		want := Sign(body, secret)
		if err == nil && (secret == "" || !strings.EqualFold(header, want) || !strings.HasPrefix(header, "sha256=")) {
			t.Fatalf("accepted header %q for secret %q, the signature is %q", header, secret, want)
		}
		if secret != "" && VerifySignature(body, want, secret) != nil {
			t.Fatal("a correct signature was refused")
		}
	})
}

type notFoundReceipts struct{}

func (notFoundReceipts) MessageApplyReceipt(context.Context, outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return outbox.ReceiptResult{}, outbox.ErrNotFound
}

// FuzzWebhookPOST sends arbitrary signed bodies: the handler answers 200 or
// 400 (or 401/403 for a disagreeing tenant), never panics and never 5xx when
// the store is healthy.
func FuzzWebhookPOST(f *testing.F) {
	f.Add(statusBody(testPhoneID, st("wamid.1", "failed", 1)))
	f.Add(inboundBody(testPhoneID, inboundMsg("wamid.2", 1)))
	f.Add(statusBody(testPhoneID2, st("wamid.1", "read", 1)))
	f.Add([]byte(`{"entry":[{"changes":[{"value":{"metadata":{"phone_number_id":"106540352242922"},"messages":[{"id":"m","from":"+"}]}}]}]}`))
	f.Add([]byte(`not json`))
	h, err := NewWebhook(WebhookConfig{
		Credentials: testCreds(), Receipts: notFoundReceipts{}, Windows: NewMemoryState(QuotaOptions{}),
		OnInbound: func(context.Context, InboundMessage) error { return nil },
		OnStatus:  func(context.Context, StatusEvent) {},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := post(h, body, Sign(body, testSecret))
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized:
		default:
			t.Fatalf("status %d for %q", w.Code, body)
		}
	})
}

func FuzzBuildRequest(f *testing.F) {
	f.Add([]byte(templatePayload))
	f.Add([]byte(textPayload))
	f.Add([]byte(`{"to":"+16505551234","type":"image","image":{"link":"x"}}`))
	f.Add([]byte(`{"to":"+16505551234","templateCode":"t","payloadJson":"{\"language\":{\"code\":\"en\"}}"}`))
	f.Add([]byte(`{"to":"+16505551234","template":{"name":"n","language":7}}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		req, err := BuildRequest(payload, "en_US", "cb")
		if err != nil {
			return
		}
		var b map[string]any
		if err := json.Unmarshal(req.Body, &b); err != nil {
			t.Fatalf("body is not JSON: %v", err)
		}
		if b["messaging_product"] != "whatsapp" || b["to"] != req.To || !strings.HasPrefix(req.To, "+") {
			t.Fatalf("body = %v", b)
		}
		if req.Template != (b["type"] == "template") {
			t.Fatalf("Template = %v for type %v", req.Template, b["type"])
		}
	})
}
