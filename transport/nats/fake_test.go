package nats_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit/outbox"
	outboxnats "github.com/outboxkit/outboxkit/transport/nats"
)

// fakeJS acknowledges every message at once, except those whose data is
// listed in fail (an error) or hang (never answered).
type fakeJS struct {
	mu   sync.Mutex
	sent []string
	fail map[string]error
	hang map[string]bool
	seq  uint64
}

type future struct {
	ok  chan *jetstream.PubAck
	err chan error
	m   *nats.Msg
}

func (f *future) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *future) Err() <-chan error            { return f.err }
func (f *future) Msg() *nats.Msg               { return f.m }

func (j *fakeJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f := &future{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1), m: m}
	j.sent = append(j.sent, string(m.Data))
	switch {
	case j.hang[string(m.Data)]:
	case j.fail[string(m.Data)] != nil:
		f.err <- j.fail[string(m.Data)]
	default:
		j.seq++
		f.ok <- &jetstream.PubAck{Stream: "S", Sequence: j.seq}
	}
	return f, nil
}

func TestGroupStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	js := &fakeJS{fail: map[string]error{"2": &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum messages exceeded"}}}
	p, err := outboxnats.New(outboxnats.Config{JetStream: js})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{
		{ID: "1", Topic: "t", Group: "a", Payload: []byte("1")},
		{ID: "2", Topic: "t", Group: "b", Payload: []byte("2")},
		{ID: "3", Topic: "t", Group: "a", Payload: []byte("3")},
		{ID: "4", Topic: "t", Group: "b", Payload: []byte("4")},
		{ID: "5", Topic: "t", Payload: []byte("5")},
		{ID: "6", Topic: "t", Group: "b", Payload: []byte("6")},
	}
	res := p.Publish(context.Background(), msgs)
	for _, i := range []int{0, 2, 4} {
		if res[i].Err != nil {
			t.Fatalf("message %d: %v", i, res[i].Err)
		}
	}
	var pe *outbox.PublishError
	if !errors.As(res[1].Err, &pe) || pe.Code != "js_10077" || !outbox.IsRetryable(res[1].Err) {
		t.Fatalf("message 1: %v", res[1].Err)
	}
	for _, i := range []int{3, 5} {
		if !errors.Is(res[i].Err, outbox.ErrNotAttempted) {
			t.Fatalf("message %d: %v, want not attempted", i, res[i].Err)
		}
	}
	// Wave order: the heads of the groups and the unordered message first.
	if got := strings.Join(js.sent, ","); got != "1,2,5,3" {
		t.Fatalf("sent %s", got)
	}
}

func TestAckTimeoutAndCancel(t *testing.T) {
	t.Parallel()
	js := &fakeJS{hang: map[string]bool{"1": true}}
	p, err := outboxnats.New(outboxnats.Config{JetStream: js, AckTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{
		{ID: "1", Topic: "t", Group: "a", Payload: []byte("1")},
		{ID: "2", Topic: "t", Group: "a", Payload: []byte("2")},
		{ID: "3", Topic: "t", Payload: []byte("3")},
	}
	res := p.Publish(context.Background(), msgs)
	var pe *outbox.PublishError
	if !errors.As(res[0].Err, &pe) || pe.Code != "timeout" || !outbox.IsRetryable(res[0].Err) {
		t.Fatalf("message 0: %v", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) || res[2].Err != nil {
		t.Fatalf("messages 1, 2: %v, %v", res[1].Err, res[2].Err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p, _ = outboxnats.New(outboxnats.Config{JetStream: js})
	res = p.Publish(ctx, msgs[:2])
	if !errors.Is(res[0].Err, context.DeadlineExceeded) || errors.Is(res[0].Err, outbox.ErrNotAttempted) || !outbox.IsRetryable(res[0].Err) {
		t.Fatalf("message 0: %v, want retryable deadline exceeded", res[0].Err)
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) {
		t.Fatalf("message 1: %v", res[1].Err)
	}
}

func TestInvalidMessages(t *testing.T) {
	t.Parallel()
	js := &fakeJS{}
	p, err := outboxnats.New(outboxnats.Config{JetStream: js, Subject: func(m *outbox.Message) (string, error) {
		if m.Topic == "none" {
			return "", errors.New("no route")
		}
		return m.Topic, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Publish(context.Background(), []outbox.Message{
		{ID: "1", Topic: "none", Payload: []byte("1")},
		{ID: "2", Topic: "a.*", Payload: []byte("2")},
		{ID: "3", Topic: "a..b", Payload: []byte("3")},
		{ID: "4", Topic: "ok", Headers: map[string]string{"bad key": "v"}, Payload: []byte("4")},
		{ID: "5", Topic: "ok", Payload: []byte("5")},
	})
	for i := range 4 {
		if res[i].Err == nil || outbox.IsRetryable(res[i].Err) {
			t.Fatalf("message %d: %v, want permanent", i, res[i].Err)
		}
	}
	if res[4].Err != nil || res[4].ProviderMessageID != "S:1" || len(js.sent) != 1 {
		t.Fatalf("message 4: %+v, sent %v", res[4], js.sent)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxnats.Config{
		{},
		{JetStream: &fakeJS{}, AckTimeout: -1},
		{JetStream: &fakeJS{}, MaxInFlight: -1},
		{JetStream: &fakeJS{}, SubjectPrefix: "x.", Subject: func(*outbox.Message) (string, error) { return "", nil }},
	} {
		if _, err := outboxnats.New(cfg); err == nil {
			t.Fatalf("New(%+v) = nil error", cfg)
		}
	}
}
