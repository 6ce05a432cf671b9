package nats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	outboxnats "github.com/outboxkit/outboxkit/transport/nats"
)

type bundle struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	prefix string // subject prefix captured by the stream
}

// setup connects to the test server and creates a stream of its own that
// captures prefix+">"; both are removed when t ends.
func setup(t *testing.T) *bundle {
	t.Helper()
	url := testbackend.NATSURL(t)
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		testbackend.Unavailable(t, "NATS", "connect "+url+": "+err.Error())
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "OUTBOXKIT_TEST_" + strings.ToUpper(hex.EncodeToString(b[:]))
	prefix := "outboxkit-test." + hex.EncodeToString(b[:]) + "."
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ">"}, Storage: jetstream.MemoryStorage,
		Duplicates: time.Minute,
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			testbackend.Unavailable(t, "NATS JetStream", err.Error())
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return &bundle{nc: nc, js: js, stream: st, prefix: prefix}
}

func newPublisher(t *testing.T, cfg outboxnats.Config) *outboxnats.Publisher {
	t.Helper()
	p, err := outboxnats.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func msg(id, topic, group string, n int) outbox.Message {
	return outbox.Message{
		ID: id, Tenant: "acme", Topic: topic, Group: group,
		Payload: []byte(fmt.Sprintf(`{"n":%d}`, n)),
		Headers: map[string]string{"traceparent": "00-" + id},
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPublishBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxnats.Config{JetStream: b.js, SubjectPrefix: b.prefix, MaxInFlight: 3})
	var msgs []outbox.Message
	for n := range 12 {
		group := ""
		if n%3 != 0 {
			group = "g" + strconv.Itoa(n%3)
		}
		msgs = append(msgs, msg(fmt.Sprintf("id-%02d", n), "orders", group, n))
	}
	ctx := ctxT(t)
	res := p.Publish(ctx, msgs)
	if len(res) != len(msgs) {
		t.Fatalf("got %d results for %d messages", len(res), len(msgs))
	}
	seqOf := map[string]uint64{}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
		stream, seq, ok := strings.Cut(r.ProviderMessageID, ":")
		if !ok || stream != b.stream.CachedInfo().Config.Name {
			t.Fatalf("message %d: ProviderMessageID %q", i, r.ProviderMessageID)
		}
		s, _ := strconv.ParseUint(seq, 10, 64)
		seqOf[msgs[i].ID] = s
		if len(r.ProviderResponse) == 0 {
			t.Fatalf("message %d: no ProviderResponse", i)
		}
	}
	// Group order holds in the stream.
	last := map[string]uint64{}
	for _, m := range msgs {
		if m.Group == "" {
			continue
		}
		if seqOf[m.ID] <= last[m.Group] {
			t.Fatalf("group %s out of order: %s at seq %d after %d", m.Group, m.ID, seqOf[m.ID], last[m.Group])
		}
		last[m.Group] = seqOf[m.ID]
	}
	// Read back what was stored.
	for _, m := range msgs {
		got, err := b.stream.GetMsg(ctx, seqOf[m.ID])
		if err != nil {
			t.Fatal(err)
		}
		if got.Subject != b.prefix+"orders" || string(got.Data) != string(m.Payload) {
			t.Fatalf("%s: stored %s %s", m.ID, got.Subject, got.Data)
		}
		want := map[string]string{
			"Nats-Msg-Id": m.ID, outboxnats.HeaderID: m.ID, outboxnats.HeaderTenant: "acme",
			outboxnats.HeaderTopic: "orders", outboxnats.HeaderGroup: m.Group,
			outboxnats.HeaderContentType: "application/json", "traceparent": "00-" + m.ID,
		}
		for k, v := range want {
			if got.Header.Get(k) != v {
				t.Fatalf("%s: header %s = %q, want %q", m.ID, k, got.Header.Get(k), v)
			}
		}
	}
}

func TestPublishDeduplicatesByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxnats.Config{JetStream: b.js, SubjectPrefix: b.prefix})
	ctx := ctxT(t)
	m := msg("dup-1", "orders", "", 1)
	first := p.Publish(ctx, []outbox.Message{m})
	again := p.Publish(ctx, []outbox.Message{m})
	if first[0].Err != nil || again[0].Err != nil {
		t.Fatal(first[0].Err, again[0].Err)
	}
	if first[0].ProviderMessageID != again[0].ProviderMessageID {
		t.Fatalf("re-publish got %s, first %s", again[0].ProviderMessageID, first[0].ProviderMessageID)
	}
	if !strings.Contains(string(again[0].ProviderResponse), `"duplicate":true`) {
		t.Fatalf("re-publish response %s", again[0].ProviderResponse)
	}
	info, err := b.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestPublishCanceledContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxnats.Config{JetStream: b.js, SubjectPrefix: b.prefix})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := p.Publish(ctx, []outbox.Message{msg("c1", "orders", "g", 1), msg("c2", "orders", "", 2)})
	for i, r := range res {
		if !errors.Is(r.Err, outbox.ErrNotAttempted) || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("message %d: %v, want not attempted and canceled", i, r.Err)
		}
	}
	info, err := b.stream.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("stream holds %d messages, want 0", info.State.Msgs)
	}
}

func TestPublishClosedConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nc, err := nats.Connect(b.nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, outboxnats.Config{JetStream: js, SubjectPrefix: b.prefix})
	nc.Close()
	res := p.Publish(ctxT(t), []outbox.Message{msg("x1", "orders", "g", 1), msg("x2", "orders", "g", 2), msg("x3", "orders", "", 3)})
	for _, i := range []int{0, 2} {
		var pe *outbox.PublishError
		if !errors.As(res[i].Err, &pe) || pe.Code != "connection" || !outbox.IsRetryable(res[i].Err) || errors.Is(res[i].Err, outbox.ErrNotAttempted) {
			t.Fatalf("message %d: %v, want a retryable connection error", i, res[i].Err)
		}
	}
	if !errors.Is(res[1].Err, outbox.ErrNotAttempted) {
		t.Fatalf("group's second message: %v, want not attempted", res[1].Err)
	}
}

func TestPublishNoStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, permanent := range []bool{false, true} {
		p := newPublisher(t, outboxnats.Config{JetStream: b.js, SubjectPrefix: "outboxkit-test-nostream.", NoStreamIsPermanent: permanent})
		res := p.Publish(ctxT(t), []outbox.Message{msg("n1", "orders", "", 1)})
		var pe *outbox.PublishError
		if !errors.As(res[0].Err, &pe) || pe.Code != "no_stream" || outbox.IsRetryable(res[0].Err) == permanent {
			t.Fatalf("permanent=%v: %v", permanent, res[0].Err)
		}
	}
}

func TestPublishTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPublisher(t, outboxnats.Config{JetStream: b.js, SubjectPrefix: b.prefix})
	big := `"` + strings.Repeat("x", int(b.nc.MaxPayload())+10) + `"`
	m := msg("big", "orders", "", 0)
	m.Payload = []byte(big)
	res := p.Publish(ctxT(t), []outbox.Message{m})
	if res[0].Err == nil || outbox.IsRetryable(res[0].Err) {
		t.Fatalf("got %v, want a permanent error", res[0].Err)
	}
}
