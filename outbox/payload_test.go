package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

func TestContentTypeAndPayloadValidation(t *testing.T) {
	t.Parallel()
	binary := []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 0x80}
	for _, c := range []struct {
		name  string
		m     outbox.Message
		field string // "" = valid
	}{
		{"JSON by default", outbox.Message{Topic: "t", Payload: []byte(`{"a":1}`)}, ""},
		{"protobuf bytes", outbox.Message{Topic: "t", ContentType: "application/x-protobuf", Payload: binary}, ""},
		{"empty protobuf message", outbox.Message{Topic: "t", ContentType: "application/x-protobuf"}, ""},
		{"+json suffix is JSON", outbox.Message{Topic: "t", ContentType: "application/cloudevents+json; charset=utf-8", Payload: binary}, "Payload"},
		{"Application/JSON is JSON", outbox.Message{Topic: "t", ContentType: "Application/JSON", Payload: []byte(`{"a":`)}, "Payload"},
		{"default JSON refuses binary", outbox.Message{Topic: "t", Payload: binary}, "Payload"},
		{"JSON must be UTF-8", outbox.Message{Topic: "t", Payload: []byte("\"\xff\"")}, "Payload"},
		{"JSON must not be empty", outbox.Message{Topic: "t", ContentType: "application/json"}, "Payload"},
		{"not a media type", outbox.Message{Topic: "t", ContentType: "protobuf please", Payload: binary}, "ContentType"},
		{"control character", outbox.Message{Topic: "t", ContentType: "text/plain\n", Payload: binary}, "ContentType"},
		{"too long", outbox.Message{Topic: "t", ContentType: "application/" + strings.Repeat("x", 250), Payload: binary}, "ContentType"},
	} {
		err := outbox.ValidateMessage(&c.m)
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", c.name, err)
			}
			continue
		}
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("%s: want invalid %s, got %v", c.name, c.field, err)
		}
	}
	m := outbox.Message{ContentType: "application/vnd.kafka+JSON"}
	if !m.IsJSON() || m.EffectiveContentType() != "application/vnd.kafka+JSON" {
		t.Errorf("IsJSON %v EffectiveContentType %q", m.IsJSON(), m.EffectiveContentType())
	}
	if m := (outbox.Message{}); !m.IsJSON() || m.EffectiveContentType() != "application/json" {
		t.Errorf("empty content type: IsJSON %v EffectiveContentType %q", m.IsJSON(), m.EffectiveContentType())
	}
}

func TestPayloadLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	big := func(n int) outbox.Message {
		return outbox.Message{Topic: "t", ContentType: "application/octet-stream", Payload: bytes.Repeat([]byte{0}, n)}
	}

	// The default is 1 MiB, named in the error.
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	if err := ob.Err(); err != nil || ob.MaxPayloadBytes() != outbox.DefaultMaxPayloadBytes {
		t.Fatalf("Err %v, MaxPayloadBytes %d", err, ob.MaxPayloadBytes())
	}
	if _, err := ob.Enqueue(ctx, big(outbox.DefaultMaxPayloadBytes)); err != nil {
		t.Fatalf("a payload of exactly the default limit: %v", err)
	}
	_, err := ob.Enqueue(ctx, big(1), big(outbox.DefaultMaxPayloadBytes+1))
	var tl *outbox.PayloadTooLargeError
	if !errors.As(err, &tl) || tl.Limit != outbox.DefaultMaxPayloadBytes || tl.Size != outbox.DefaultMaxPayloadBytes+1 || tl.StoreCeiling ||
		!errors.Is(err, outbox.ErrPayloadTooLarge) || !errors.Is(err, outbox.ErrInvalidInput) ||
		!strings.Contains(err.Error(), "1048576") || !strings.Contains(err.Error(), "Options.MaxPayloadBytes") {
		t.Fatalf("over the default: %v", err)
	}
	if c, _ := st.MessageCount(ctx, outbox.MessageCountParams{}); c[outbox.StatusPending] != 1 {
		t.Fatalf("a refused batch inserted something: %v", c)
	}

	// A configured limit, lower and higher.
	small := outbox.New[*sql.Tx](st, outbox.Options{MaxPayloadBytes: 10})
	if _, err := small.Enqueue(ctx, big(11)); !errors.As(err, &tl) || tl.Limit != 10 {
		t.Fatalf("over a limit of 10: %v", err)
	}
	large := outbox.New[*sql.Tx](st, outbox.Options{MaxPayloadBytes: 3 << 20})
	res, err := large.Enqueue(ctx, big(3<<20))
	if err != nil || len(res[0].Message.Payload) != 3<<20 {
		t.Fatalf("3 MiB under a 3 MiB limit: %v", err)
	}

	// Misconfiguration: every Enqueue reports it, nothing is inserted.
	for _, c := range []struct {
		limit int
		want  string
	}{{-1, "must not be negative"}, {st.MaxPayloadBytes() + 1, "above the store's ceiling"}} {
		bad := outbox.New[*sql.Tx](st, outbox.Options{MaxPayloadBytes: c.limit})
		var ve *outbox.ValidationError
		if err := bad.Err(); !errors.As(err, &ve) || ve.Field != "Options.MaxPayloadBytes" || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("MaxPayloadBytes %d: Err() = %v", c.limit, err)
		}
		if _, err := bad.Enqueue(ctx, big(1)); !errors.Is(err, bad.Err()) {
			t.Fatalf("MaxPayloadBytes %d: Enqueue = %v", c.limit, err)
		}
	}

	// A store called directly applies its ceiling even to prepared messages.
	now := time.Now()
	m := big(st.MaxPayloadBytes() + 1)
	m.ID, m.IdempotencyKey, m.Status, m.CreatedAt, m.UpdatedAt, m.NextAttemptAt = outbox.NewID(now), "k", outbox.StatusPending, now, now, now
	_, err = st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{MaxPayloadBytes: 2 * st.MaxPayloadBytes(), Messages: []outbox.Message{m}})
	if !errors.As(err, &tl) || !tl.StoreCeiling || tl.Limit != st.MaxPayloadBytes() || !strings.Contains(err.Error(), "store's ceiling") {
		t.Fatalf("over the store's ceiling: %v", err)
	}
	if c, _ := st.MessageCount(ctx, outbox.MessageCountParams{}); c[outbox.StatusPending] != 2 {
		t.Fatalf("want the 2 accepted messages, counts %v", c)
	}
}
