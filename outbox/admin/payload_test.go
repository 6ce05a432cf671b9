package admin_test

import (
	"bytes"
	"database/sql"
	"net/http"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
)

// TestBinaryPayloadShownAsBase64: the API answers valid JSON for a message
// whose payload is not JSON (its bytes in payload_base64, its content type
// and length beside), and embeds a JSON payload as before.
func TestBinaryPayloadShownAsBase64(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bin := []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 0x80}
	res, err := outbox.New[*sql.Tx](f.store, outbox.Options{}).Enqueue(f.ctx,
		outbox.Message{Topic: "events", ContentType: "application/x-protobuf", Payload: bin})
	if err != nil {
		t.Fatal(err)
	}
	var d admin.Detail
	if code := f.do(http.MethodGet, "api/messages/"+res[0].Message.ID, nil, true, &d); code != 200 {
		t.Fatalf("get: %d", code)
	}
	if d.Message.ContentType != "application/x-protobuf" || !bytes.Equal(d.Message.PayloadBase64, bin) ||
		string(d.Message.Payload) != "null" || d.Message.PayloadBytes != len(bin) {
		t.Fatalf("binary message: %+v", d.Message)
	}
	var page admin.Page
	if code := f.do(http.MethodGet, "api/messages?topic=events", nil, true, &page); code != 200 || len(page.Messages) != 1 {
		t.Fatalf("list: %d %+v", code, page)
	}
	d = admin.Detail{}
	f.do(http.MethodGet, "api/messages/"+f.queued[0].ID, nil, true, &d)
	if string(d.Message.Payload) != `{"q":0}` || d.Message.PayloadBase64 != nil || d.Message.ContentType != "" || d.Message.PayloadBytes != 7 {
		t.Fatalf("JSON message: %+v", d.Message)
	}
}
