package whatsapp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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

func (notFoundReceipts) MessageGet(context.Context, outbox.MessageGetParams) (outbox.Message, error) {
	return outbox.Message{}, outbox.ErrNotFound
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

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// FuzzErrorResponse feeds arbitrary Cloud API answers to the publisher: it
// never panics, a non-2xx answer is always a *outbox.PublishError or (a rate
// limit) a *outbox.DeferError with a code, and the token never reaches the
// stored error.
func FuzzErrorResponse(f *testing.F) {
	f.Add(400, []byte(`{"error":{"message":"(#131047) Re-engagement message","type":"OAuthException","code":131047,"error_data":{"details":"More than 24 hours"},"fbtrace_id":"x"}}`), "")
	f.Add(429, []byte(``), "120")
	f.Add(500, []byte(`{"error":{"code":"131000"}}`), "Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add(200, []byte(`{"messages":[{"id":"wamid.1"}]}`), "")
	f.Add(200, []byte(`{"messages":[{"id":""}]}`), "")
	f.Add(403, []byte(`{"error":{"code":-1,"message":"`+testToken+`"}}`), "-5")
	f.Fuzz(func(t *testing.T, status int, body []byte, retryAfter string) {
		if status < 100 || status > 999 {
			return
		}
		client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{}
			h.Set("Retry-After", retryAfter)
			return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(bytes.NewReader(body)), Request: r}, nil
		})}
		p, err := NewPublisher(Config{Credentials: testCreds(), HTTPClient: client, Throughput: -1, Quotas: NewMemoryState(QuotaOptions{})})
		if err != nil {
			t.Fatal(err)
		}
		r := p.Send(context.Background(), &outbox.Message{ID: "m", Tenant: "org-1", Topic: "whatsapp", Payload: []byte(templatePayload)})
		if r.Err == nil {
			if status < 200 || status > 299 || r.ProviderMessageID == "" {
				t.Fatalf("success for status %d without an id", status)
			}
			return
		}
		var pe *outbox.PublishError
		var de *outbox.DeferError
		var code, message string
		switch {
		case errors.As(r.Err, &de):
			// a rate limit: deferred, neither too soon nor too far
			if de.Delay < time.Second || de.Delay > 7*24*time.Hour {
				t.Fatalf("deferred for %v", de.Delay)
			}
			code, message = de.Code, de.Message
		case errors.As(r.Err, &pe):
			if pe.RetryAfter < 0 || pe.RetryAfter > 7*24*time.Hour {
				t.Fatalf("RetryAfter %v", pe.RetryAfter)
			}
			code, message = pe.Code, pe.Message
		default:
			t.Fatalf("error %v is neither a PublishError nor a DeferError", r.Err)
		}
		if code == "" {
			t.Fatalf("error %v has no code", r.Err)
		}
		if strings.Contains(message, testToken) || strings.Contains(string(r.ProviderResponse), testToken) {
			t.Fatal("the token leaked")
		}
	})
}
