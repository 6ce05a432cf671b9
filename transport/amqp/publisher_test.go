package amqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	outboxamqp "github.com/outboxkit/outboxkit/transport/amqp"
)

type bundle struct {
	url      string
	exchange string
	ch       *amqp.Channel
	queue    string
}

// setup declares an auto-delete exchange of its own bound (key "orders") to
// an exclusive queue; they go away when t ends.
func setup(t *testing.T) *bundle {
	t.Helper()
	url := testbackend.AMQPURL(t)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		testbackend.Unavailable(t, "RabbitMQ", err.Error())
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "outboxkit-test-" + hex.EncodeToString(b[:])
	if err := ch.ExchangeDeclare(name, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare(name, false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "orders", name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(q.Name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	return &bundle{url: url, exchange: name, ch: ch, queue: q.Name}
}

// receive consumes n messages from the test queue.
func (b *bundle) receive(t *testing.T, n int) []amqp.Delivery {
	t.Helper()
	ds, err := b.ch.Consume(b.queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []amqp.Delivery
	timeout := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case d := <-ds:
			got = append(got, d)
		case <-timeout:
			t.Fatalf("received %d messages, want %d", len(got), n)
		}
	}
	return got
}

func newPublisher(t *testing.T, cfg outboxamqp.Config) *outboxamqp.Publisher {
	t.Helper()
	p, err := outboxamqp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func msg(id, topic, group string, n int) outbox.Message {
	return outbox.Message{
		ID: id, Tenant: "acme", Topic: topic, Group: group,
		Payload:   []byte(fmt.Sprintf(`{"n":%d}`, n)),
		Headers:   map[string]string{"traceparent": "00-" + id},
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func code(err error) string {
	var pe *outbox.PublishError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func TestPublishBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxamqp.Config{URL: b.url, Exchange: b.exchange, MaxInFlight: 4})
	var msgs []outbox.Message
	for n := range 12 {
		group := ""
		if n%3 != 0 {
			group = fmt.Sprintf("g%d", n%3)
		}
		msgs = append(msgs, msg(fmt.Sprintf("id-%02d", n), "orders", group, n))
	}
	res := p.Publish(ctxT(t), msgs)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	got := b.receive(t, len(msgs))
	byID := map[string]outbox.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	last := map[string]string{}
	for _, d := range got {
		m, ok := byID[d.MessageId]
		if !ok {
			t.Fatalf("unexpected message-id %q", d.MessageId)
		}
		delete(byID, d.MessageId)
		if string(d.Body) != string(m.Payload) || d.ContentType != "application/json" || d.DeliveryMode != amqp.Persistent ||
			!d.Timestamp.Equal(m.CreatedAt) || d.Exchange != b.exchange || d.RoutingKey != "orders" {
			t.Fatalf("%s: got %+v", m.ID, d)
		}
		want := map[string]any{
			outboxamqp.HeaderID: m.ID, outboxamqp.HeaderTenant: "acme", outboxamqp.HeaderTopic: "orders",
			"traceparent": "00-" + m.ID,
		}
		if m.Group != "" {
			want[outboxamqp.HeaderGroup] = m.Group
		}
		for k, v := range want {
			if d.Headers[k] != v {
				t.Fatalf("%s: header %s = %v, want %v", m.ID, k, d.Headers[k], v)
			}
		}
		if m.Group != "" {
			if m.ID <= last[m.Group] {
				t.Fatalf("group %s out of order: %s after %s", m.Group, m.ID, last[m.Group])
			}
			last[m.Group] = m.ID
		}
	}
}

func TestPublishUnroutableIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The group is scoped by topic: route u1 elsewhere with a header.
	p := newPublisher(t, outboxamqp.Config{URL: b.url, Route: func(m *outbox.Message) (string, string, error) {
		if rk := m.Headers["rk"]; rk != "" {
			return b.exchange, rk, nil
		}
		return b.exchange, m.Topic, nil
	}})
	u1 := msg("u1", "orders", "g", 1)
	u1.Headers["rk"] = "nowhere"
	res := p.Publish(ctxT(t), []outbox.Message{
		u1,
		msg("u2", "orders", "g", 2), // behind u1 in its group
		msg("u3", "orders", "", 3),
	})
	if code(res[0].Err) != "unroutable" || outbox.IsRetryable(res[0].Err) {
		t.Fatalf("message 0: %v, want permanent unroutable", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) {
		t.Fatalf("message 1: %v, want not attempted", res[1].Err)
	}
	if res[2].Err != nil {
		t.Fatalf("message 2: %v", res[2].Err)
	}
	if got := b.receive(t, 1); got[0].MessageId != "u3" {
		t.Fatalf("received %s", got[0].MessageId)
	}

	// With AllowUnroutable the broker drops it and it counts as sent.
	p2 := newPublisher(t, outboxamqp.Config{URL: b.url, Exchange: b.exchange, AllowUnroutable: true})
	if res := p2.Publish(ctxT(t), []outbox.Message{msg("u4", "nowhere", "", 4)}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
}

func TestPublishMissingExchangeReopensChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxamqp.Config{URL: b.url, Route: func(m *outbox.Message) (string, string, error) {
		if m.Topic == "missing" {
			return b.exchange + "-missing", "orders", nil
		}
		if m.Topic == "bad" {
			return "", "", errors.New("no route for bad")
		}
		return b.exchange, m.Topic, nil
	}})
	res := p.Publish(ctxT(t), []outbox.Message{msg("m1", "missing", "", 1), msg("m2", "bad", "", 2)})
	if code(res[0].Err) != "not_found" || !outbox.IsRetryable(res[0].Err) {
		t.Fatalf("message 0: %v, want retryable not_found", res[0].Err)
	}
	if code(res[1].Err) != "route" || outbox.IsRetryable(res[1].Err) {
		t.Fatalf("message 1: %v, want permanent route", res[1].Err)
	}
	// The broker closed the channel; the next call opens a new one.
	res = p.Publish(ctxT(t), []outbox.Message{msg("m3", "orders", "", 3)})
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if got := b.receive(t, 1); got[0].MessageId != "m3" {
		t.Fatalf("received %s", got[0].MessageId)
	}
}

func TestPublishReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var conns []*amqp.Connection
	p := newPublisher(t, outboxamqp.Config{Exchange: b.exchange, Dial: func(context.Context) (*amqp.Connection, error) {
		c, err := amqp.Dial(b.url)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}})
	if res := p.Publish(ctxT(t), []outbox.Message{msg("r1", "orders", "", 1)}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	// The connection is lost (closed under the Publisher's feet).
	mu.Lock()
	_ = conns[0].Close()
	mu.Unlock()
	if res := p.Publish(ctxT(t), []outbox.Message{msg("r2", "orders", "", 2)}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	mu.Lock()
	n := len(conns)
	mu.Unlock()
	if n != 2 {
		t.Fatalf("dialled %d times, want 2", n)
	}
	got := b.receive(t, 2)
	if got[0].MessageId != "r1" || got[1].MessageId != "r2" {
		t.Fatalf("received %s, %s", got[0].MessageId, got[1].MessageId)
	}
}

func TestPublishUnreachableBroker(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, outboxamqp.Config{URL: "amqp://user:s3cret-pass@127.0.0.1:1/", DialTimeout: time.Second})
	res := p.Publish(ctxT(t), []outbox.Message{msg("d1", "orders", "g", 1), msg("d2", "orders", "g", 2)})
	if code(res[0].Err) != "connection" || !outbox.IsRetryable(res[0].Err) {
		t.Fatalf("message 0: %v, want retryable connection", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) {
		t.Fatalf("message 1: %v", res[1].Err)
	}
	if strings.Contains(res[0].Err.Error(), "s3cret") {
		t.Fatalf("the password leaked: %v", res[0].Err)
	}
}

func TestPublishCanceledAndClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxamqp.Config{URL: b.url, Exchange: b.exchange})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := p.Publish(ctx, []outbox.Message{msg("c1", "orders", "g", 1), msg("c2", "orders", "", 2)})
	for i, r := range res {
		if !errors.Is(r.Err, outbox.ErrNotAttempted) || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	res = p.Publish(ctxT(t), []outbox.Message{msg("c3", "orders", "", 3)})
	if !errors.Is(res[0].Err, outbox.ErrNotAttempted) || !errors.Is(res[0].Err, outbox.ErrClosed) {
		t.Fatalf("after Close: %v", res[0].Err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxamqp.Config{
		{},
		{URL: "http://x"},
		{URL: "amqp://x", ConfirmTimeout: -1},
		{URL: "amqp://x", MaxInFlight: -1},
		{URL: "amqp://x", Exchange: "e", Route: func(*outbox.Message) (string, string, error) { return "", "", nil }},
	} {
		if _, err := outboxamqp.New(cfg); err == nil {
			t.Fatalf("New(%+v) = nil error", cfg)
		}
	}
}
