package outboxotel_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit/outbox"
	outboxotel "github.com/outboxkit/outboxkit/outbox/otel"
	"github.com/outboxkit/outboxkit/store/sqlite"
	outboxhttp "github.com/outboxkit/outboxkit/transport/http"
	"github.com/outboxkit/outboxkit/whatsapp"
)

type bundle struct {
	store   *sqlite.Store
	spans   *tracetest.InMemoryExporter
	tp      *sdktrace.TracerProvider
	reader  *sdkmetric.ManualReader
	tel     *outboxotel.Telemetry
	ob      *outbox.Outbox[*sql.Tx]
	ctx     context.Context
	started time.Time
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "otel.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := outboxotel.New(outboxotel.Config{MeterProvider: mp, TracerProvider: tp, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Close() })
	return &bundle{
		store: st, spans: spans, tp: tp, reader: reader, tel: tel, ctx: ctx, started: time.Now(),
		ob: outbox.New[*sql.Tx](st, outbox.Options{Observer: tel, Headers: tel}),
	}
}

// wirePeer is the receiving end of transport/http: it answers by the
// payload's "n" and records the traceparent each request carried.
type wirePeer struct {
	mu          sync.Mutex
	traceparent map[int]string
}

func (w *wirePeer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	var body struct{ N int }
	_ = json.NewDecoder(r.Body).Decode(&body)
	w.mu.Lock()
	w.traceparent[body.N] = r.Header.Get("Traceparent")
	w.mu.Unlock()
	switch body.N {
	case 3:
		rw.WriteHeader(http.StatusBadRequest) // permanent: dead letter
	case 4:
		rw.WriteHeader(http.StatusServiceUnavailable) // retryable
	default:
		rw.WriteHeader(http.StatusOK)
	}
}

func payload(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)) }

// TestScriptedRun enqueues in a traced request, runs a processor through
// the telemetry publisher over transport/http, applies a WhatsApp receipt
// through the real webhook, and checks the spans and the metric values.
func TestScriptedRun(t *testing.T) {
	b := setup(t)
	ctx := b.ctx

	peer := &wirePeer{traceparent: map[int]string{}}
	srv := httptest.NewServer(peer)
	defer srv.Close()
	hp, err := outboxhttp.New(outboxhttp.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	// The HTTP peer returns no provider ID: name it after the outbox ID,
	// so that a receipt can find the message.
	orders := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []outbox.Result {
		res := hp.Publish(ctx, msgs)
		for i := range res {
			if res[i].Err == nil {
				res[i].ProviderMessageID = "wamid." + msgs[i].ID
			}
		}
		return res
	})
	quota := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		res := make([]outbox.Result, len(msgs))
		for i := range res {
			res[i].Err = &outbox.DeferError{Delay: time.Hour, Code: "quota", Message: "daily quota used"}
		}
		return res
	})
	router := outbox.NewRouter().Handle("orders", orders).Handle("sms", quota)

	// The request that enqueues: a server span.
	tracer := b.tp.Tracer("app")
	reqCtx, reqSpan := tracer.Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	var ids []string
	err = b.store.InTx(reqCtx, func(tx *sql.Tx) error {
		msgs := []outbox.Message{
			{Topic: "orders", Group: "c1", Payload: payload(1), IdempotencyKey: "k1"},
			{Topic: "orders", Payload: payload(2)},
			{Topic: "orders", Payload: payload(3)},
			{Topic: "orders", Payload: payload(4)},
			{Topic: "sms", Payload: payload(5)},
			{Topic: "orders", Group: "c1", Payload: payload(1), IdempotencyKey: "k1"}, // a repeat: not counted
		}
		res, err := b.ob.EnqueueTx(reqCtx, tx, msgs...)
		for _, r := range res {
			ids = append(ids, r.Message.ID)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	reqSpan.End()
	reqSC := reqSpan.SpanContext()
	stored, err := b.store.MessageGet(ctx, outbox.MessageGetParams{ID: ids[0]})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.tel.SpanContextOf(&stored); got.TraceID() != reqSC.TraceID() || got.SpanID() != reqSC.SpanID() {
		t.Fatalf("stored trace context = %v/%v, want the request span %v/%v", got.TraceID(), got.SpanID(), reqSC.TraceID(), reqSC.SpanID())
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, b.store, b.tel.Publisher(router), outbox.Config{
			Observer: b.tel, PollInterval: 20 * time.Millisecond, PublishBatchSize: 10,
		})
	}()
	// Wait until every message left PENDING-now: 1, 2 SENT; 3 FAILED; 4
	// PENDING (retry in a minute); 5 PENDING (deferred an hour).
	want := map[int]outbox.Status{0: outbox.StatusSent, 1: outbox.StatusSent, 2: outbox.StatusFailed, 3: outbox.StatusPending, 4: outbox.StatusPending}
	deadline := time.Now().Add(30 * time.Second)
	for {
		okAll := true
		for i, st := range want {
			m, err := b.store.MessageGet(ctx, outbox.MessageGetParams{ID: ids[i]})
			if err != nil {
				t.Fatal(err)
			}
			if m.Status != st || (st == outbox.StatusPending && m.LastError == nil) {
				okAll = false
			}
		}
		if okAll {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the processor did not reach the scripted outcomes in 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A WhatsApp "delivered" receipt for message 1, in a request trace of
	// its own, through the real webhook.
	hook, err := whatsapp.NewWebhook(whatsapp.WebhookConfig{
		Credentials: whatsapp.StaticCredentials{"": {PhoneNumberID: "pn-1", AccessToken: "tok", AppSecret: "s3cret"}},
		Receipts:    b.store,
		Observer:    b.tel,
	})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(fmt.Sprintf(`{"object":"whatsapp_business_account","entry":[{"id":"waba","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"phone_number_id":"pn-1"},"statuses":[{"id":"wamid.%s","status":"delivered","timestamp":"%d","recipient_id":"33612345678"}]}}]}]}`, ids[0], time.Now().Unix()))
	mac := hmac.New(sha256.New, []byte("s3cret"))
	mac.Write(body)
	hookCtx, hookSpan := tracer.Start(ctx, "POST /webhooks/whatsapp", trace.WithSpanKind(trace.SpanKindServer))
	req := httptest.NewRequestWithContext(hookCtx, http.MethodPost, "/webhooks/whatsapp", bytes.NewReader(body))
	req.Header.Set(whatsapp.SignatureHeader, "sha256="+hex.EncodeToString(mac.Sum(nil)))
	rec := httptest.NewRecorder()
	hook.ServeHTTP(rec, req)
	hookSpan.End()
	if rec.Code != http.StatusOK {
		t.Fatalf("webhook answered %d: %s", rec.Code, rec.Body)
	}

	t.Run("trace", func(t *testing.T) {
		spans := b.spans.GetSpans()
		var pub1, receipt *tracetest.SpanStub
		for i := range spans {
			s := &spans[i]
			for _, a := range s.Attributes {
				if a.Key == "messaging.message.id" && a.Value.AsString() == ids[0] {
					switch s.Name {
					case "publish orders":
						pub1 = s
					case "receipt DELIVERED":
						receipt = s
					}
				}
			}
		}
		if pub1 == nil || receipt == nil {
			t.Fatalf("want a publish and a receipt span for message 1; spans: %v", names(spans))
		}
		// The publish span continues the enqueuing request's trace.
		if pub1.Parent.SpanID() != reqSC.SpanID() || pub1.SpanContext.TraceID() != reqSC.TraceID() {
			t.Errorf("publish span parent = %v, want the request span %v", pub1.Parent.SpanID(), reqSC.SpanID())
		}
		if pub1.SpanKind != trace.SpanKindProducer || len(pub1.Links) != 1 || pub1.Links[0].SpanContext.SpanID() != reqSC.SpanID() {
			t.Errorf("publish span: kind %v, links %v; want a producer linked to the request", pub1.SpanKind, pub1.Links)
		}
		// The wire carried the publish span, not the request span.
		peer.mu.Lock()
		tp := peer.traceparent[1]
		peer.mu.Unlock()
		wantTP := fmt.Sprintf("00-%s-%s-01", pub1.SpanContext.TraceID(), pub1.SpanContext.SpanID())
		if tp != wantTP {
			t.Errorf("the HTTP request carried traceparent %q, want the publish span's %q", tp, wantTP)
		}
		// A consumer continues from the headers it received.
		got := trace.SpanContextFromContext(b.tel.Extract(ctx, map[string]string{"traceparent": tp}))
		if got.SpanID() != pub1.SpanContext.SpanID() || got.TraceID() != reqSC.TraceID() {
			t.Errorf("Extract gave %v/%v, want the publish span in the request's trace", got.TraceID(), got.SpanID())
		}
		// The receipt lives in the webhook request's trace, linked back.
		if receipt.Parent.SpanID() != hookSpan.SpanContext().SpanID() {
			t.Errorf("receipt span parent = %v, want the webhook request span", receipt.Parent.SpanID())
		}
		if len(receipt.Links) != 1 || receipt.Links[0].SpanContext.TraceID() != reqSC.TraceID() {
			t.Errorf("receipt span links = %v, want one to the enqueuing trace %v", receipt.Links, reqSC.TraceID())
		}
	})

	t.Run("metrics", func(t *testing.T) {
		var rm metricdata.ResourceMetrics
		if err := b.reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		orders := attribute.NewSet(outboxotel.AttrTopic.String("orders"))
		check := func(name string, set attribute.Set, want int64) {
			t.Helper()
			if got := sumInt(t, rm, name, set); got != want {
				t.Errorf("%s%v = %d, want %d", name, set.ToSlice(), got, want)
			}
		}
		check(outboxotel.MetricEnqueued, orders, 4)
		check(outboxotel.MetricEnqueued, attribute.NewSet(outboxotel.AttrTopic.String("sms")), 1)
		check(outboxotel.MetricPublished, orders, 2)
		check(outboxotel.MetricDeadLettered, attribute.NewSet(outboxotel.AttrTopic.String("orders"), outboxotel.AttrErrorCode.String("http_400")), 1)
		check(outboxotel.MetricRetried, attribute.NewSet(outboxotel.AttrTopic.String("orders"), outboxotel.AttrErrorCode.String("http_503")), 1)
		check(outboxotel.MetricFailed, attribute.NewSet(outboxotel.AttrTopic.String("orders"), outboxotel.AttrErrorCode.String("http_400")), 1)
		check(outboxotel.MetricDeferred, attribute.NewSet(outboxotel.AttrTopic.String("sms"), outboxotel.AttrErrorCode.String("quota")), 1)
		check(outboxotel.MetricReceipts, attribute.NewSet(outboxotel.AttrStatus.String("DELIVERED")), 1)
		// The gauges read the store: 1 DELIVERED, 1 SENT, 1 FAILED, 2 PENDING.
		for st, n := range map[outbox.Status]int64{outbox.StatusDelivered: 1, outbox.StatusSent: 1, outbox.StatusFailed: 1, outbox.StatusPending: 2, outbox.StatusProcessing: 0} {
			check(outboxotel.MetricQueueDepth, attribute.NewSet(outboxotel.AttrStatus.String(string(st))), n)
		}
		// Oldest pending per topic: messages 4 (orders) and 5 (sms), both
		// enqueued during this test.
		for _, topic := range []string{"orders", "sms"} {
			age := gaugeFloat(t, rm, outboxotel.MetricOldestPendingAge, attribute.NewSet(outboxotel.AttrTopic.String(topic)))
			if age <= 0 || age > time.Since(b.started).Seconds() {
				t.Errorf("oldest pending age of %s = %.3fs, want within the test's %.3fs", topic, age, time.Since(b.started).Seconds())
			}
		}
		// Histograms: 4 attempts on "orders" (the deferral is no attempt),
		// 2 enqueue-to-publish samples, and claims that took 5 messages in all.
		if c, _ := histogram(t, rm, outboxotel.MetricPublishLatency, orders); c != 4 {
			t.Errorf("publish latency samples = %d, want 4", c)
		}
		if c, sum := histogram(t, rm, outboxotel.MetricCommitToPublish, orders); c != 2 || sum <= 0 || sum > 2*time.Since(b.started).Seconds() {
			t.Errorf("enqueue-to-publish: %d samples summing %.3fs, want 2 within the test's run", c, sum)
		}
		if c, sum := histogram(t, rm, outboxotel.MetricClaimBatch, attribute.NewSet()); c == 0 || sum != 5 {
			t.Errorf("claim batch sizes: %d claims took %v messages, want 5 in all", c, sum)
		}
		if c, _ := histogram(t, rm, outboxotel.MetricClaimLatency, attribute.NewSet()); c == 0 {
			t.Error("no claim latency recorded")
		}
	})
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func sumInt(t *testing.T, rm metricdata.ResourceMetrics, name string, set attribute.Set) int64 {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		t.Errorf("metric %s was not recorded", name)
		return -1
	}
	var total int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) {
				total += p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) {
				total += p.Value
			}
		}
	default:
		t.Fatalf("metric %s has data %T", name, m.Data)
	}
	return total
}

func histogram(t *testing.T, rm metricdata.ResourceMetrics, name string, set attribute.Set) (uint64, float64) {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		t.Errorf("metric %s was not recorded", name)
		return 0, 0
	}
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) {
				return p.Count, p.Sum
			}
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) {
				return p.Count, float64(p.Sum)
			}
		}
	default:
		t.Fatalf("metric %s has data %T", name, m.Data)
	}
	return 0, 0
}

func gaugeFloat(t *testing.T, rm metricdata.ResourceMetrics, name string, set attribute.Set) float64 {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		t.Errorf("metric %s was not recorded", name)
		return -1
	}
	g, ok := m.Data.(metricdata.Gauge[float64])
	if !ok {
		t.Fatalf("metric %s has data %T", name, m.Data)
	}
	for _, p := range g.DataPoints {
		if p.Attributes.Equals(&set) {
			return p.Value
		}
	}
	t.Errorf("metric %s has no point for %v", name, set.ToSlice())
	return -1
}
