// Package outboxotel instruments outboxkit with OpenTelemetry: metrics for
// every step of a message's life and traces that follow a message from the
// request that enqueued it to its publish and its delivery receipt.
//
// One Telemetry value is wired in three places:
//
//	tel, err := outboxotel.New(outboxotel.Config{Store: store})
//	defer tel.Close()
//	ob := outbox.New(store, outbox.Options{Observer: tel, Headers: tel})   // enqueue path
//	err = outbox.Run(ctx, store, tel.Publisher(pub), outbox.Config{Observer: tel})  // processor
//	hook, err := whatsapp.NewWebhook(whatsapp.WebhookConfig{Observer: tel, ...})    // receipts
//
// # Traces
//
// At enqueue the caller's span context is written into the message's
// Headers as a W3C "traceparent" (and "tracestate"), so it is stored with
// the message. The publisher returned by Telemetry.Publisher starts one
// producer span per message, "publish <topic>", as a child of that stored
// context (the trace continues from the enqueuing request, even hours
// later and in another process) and linked to it, and replaces the
// traceparent in the copy of the headers it hands on, so a publisher that
// sends headers (transport/nats, transport/amqp, transport/http, a Kafka
// publisher copying Message.Headers into record headers) carries the
// publish span to the consumer. A delivery receipt (OnDeliveryUpdated)
// records a span "receipt <status>" in the receiving request's trace,
// linked back to the message's trace.
//
// # Metrics
//
// Counters and histograms use the names of the messaging system outboxkit
// replaces where it had one (outbound_message_send_success, ..._failure,
// ..._retry, ..._dead_letter, ..._delivery_latency) and the same style for
// the rest; see the Metric* constants. Attributes: topic, error_code
// (failures), status (gauges, receipts). Tenants are not attributes (their
// number is unbounded). With Config.Store set, observable gauges report the
// queue depth by status and, when the store implements outbox.Admin, the
// age of the oldest PENDING message per topic; each collection runs one or
// two count queries. When the store implements outbox.StorageReporter
// (store/postgres), gauges also report each of its tables' live rows and
// dead row versions and the age of the database's cleanup horizon: a queue
// table whose dead rows keep growing, or a horizon thousands of
// transactions old (a transaction left open), slows every claim.
package outboxotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit/outbox"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/outboxkit/outboxkit/outbox/otel"

// Metric names.
const (
	MetricEnqueued         = "outbound_message_enqueued"           // counter {topic}
	MetricPublished        = "outbound_message_send_success"       // counter {topic}
	MetricFailed           = "outbound_message_send_failure"       // counter {topic, error_code}: every failed attempt
	MetricRetried          = "outbound_message_retry"              // counter {topic, error_code}
	MetricDeferred         = "outbound_message_deferred"           // counter {topic, error_code}
	MetricDeadLettered     = "outbound_message_dead_letter"        // counter {topic, error_code}
	MetricPublishLatency   = "outbound_message_delivery_latency"   // histogram, seconds {topic}: attempt start to outcome
	MetricCommitToPublish  = "outbound_message_enqueue_to_publish" // histogram, seconds {topic}: enqueue to SENT
	MetricClaimLatency     = "outbound_message_claim_latency"      // histogram, seconds
	MetricClaimBatch       = "outbound_message_claim_batch_size"   // histogram, messages
	MetricClaimErrors      = "outbound_message_claim_errors"       // counter
	MetricReceipts         = "outbound_message_receipts"           // counter {status}: receipts that changed a message
	MetricQueueDepth       = "outbound_message_queue_depth"        // gauge {status}
	MetricOldestPendingAge = "outbound_message_oldest_pending_age" // gauge, seconds {topic}
	MetricStoreLiveRows    = "outbound_store_live_rows"            // gauge {table}: outbox.StorageReporter
	MetricStoreDeadRows    = "outbound_store_dead_rows"            // gauge {table}: dead row versions not yet removed
	MetricStoreHorizonAge  = "outbound_store_cleanup_horizon_age"  // gauge, transactions: what holds cleanup back
)

// Attribute keys.
const (
	AttrTopic     = attribute.Key("topic")
	AttrErrorCode = attribute.Key("error_code")
	AttrStatus    = attribute.Key("status")
	AttrTable     = attribute.Key("table")
)

// Config configures a Telemetry. The zero value uses the global providers.
type Config struct {
	// MeterProvider defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in message headers.
	// Defaults to W3C trace context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
	// Store, when set, backs the queue depth gauge (MessageCount across
	// tenants), if it implements outbox.Admin the oldest pending age gauge,
	// and if it implements outbox.StorageReporter the storage gauges.
	Store outbox.Store
	// GaugeTimeout bounds the store queries of one collection. Defaults to
	// 5 seconds.
	GaugeTimeout time.Duration
}

// Telemetry is an outbox.Observer (and outbox.ClaimObserver), an
// outbox.HeaderInjector and a publisher wrapper. It is safe for concurrent
// use.
type Telemetry struct {
	cfg    Config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	reg    metric.Registration

	enqueued, published, failed, retried, deferred, dead, receipts, claimErrors metric.Int64Counter
	publishLatency, commitToPublish, claimLatency                               metric.Float64Histogram
	claimBatch                                                                  metric.Int64Histogram
}

var (
	_ outbox.Observer       = (*Telemetry)(nil)
	_ outbox.ClaimObserver  = (*Telemetry)(nil)
	_ outbox.HeaderInjector = (*Telemetry)(nil)
)

// New creates the instruments and, with Config.Store, registers the gauges.
// Close unregisters them.
func New(cfg Config) (*Telemetry, error) {
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	if cfg.GaugeTimeout <= 0 {
		cfg.GaugeTimeout = 5 * time.Second
	}
	t := &Telemetry{cfg: cfg, tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator}
	m := cfg.MeterProvider.Meter(ScopeName)
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{message}"))
		errs = append(errs, err)
		return c
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"))
		errs = append(errs, err)
		return h
	}
	t.enqueued = counter(MetricEnqueued, "Messages enqueued (new, not idempotent repeats).")
	t.published = counter(MetricPublished, "Messages published (SENT).")
	t.failed = counter(MetricFailed, "Failed publish attempts, retried or dead-lettered.")
	t.retried = counter(MetricRetried, "Failed attempts that will be retried.")
	t.deferred = counter(MetricDeferred, "Messages deferred by the publisher (quota, throttling) without an attempt.")
	t.dead = counter(MetricDeadLettered, "Messages dead-lettered (FAILED).")
	t.receipts = counter(MetricReceipts, "Delivery receipts that changed a message, by the status they set.")
	t.claimErrors = counter(MetricClaimErrors, "Claims that failed.")
	t.publishLatency = seconds(MetricPublishLatency, "Time from a publish attempt's start to its recorded outcome.")
	t.commitToPublish = seconds(MetricCommitToPublish, "Time from enqueue to SENT.")
	t.claimLatency = seconds(MetricClaimLatency, "Time one claim took in the store.")
	var err error
	t.claimBatch, err = m.Int64Histogram(MetricClaimBatch, metric.WithDescription("Messages per claim."), metric.WithUnit("{message}"))
	errs = append(errs, err)

	if cfg.Store != nil {
		depth, err := m.Int64ObservableGauge(MetricQueueDepth, metric.WithDescription("Messages by status, every tenant."), metric.WithUnit("{message}"))
		errs = append(errs, err)
		oldest, err := m.Float64ObservableGauge(MetricOldestPendingAge, metric.WithDescription("Age of the oldest PENDING message per topic, every tenant."), metric.WithUnit("s"))
		errs = append(errs, err)
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		g := gauges{depth: depth, oldest: oldest}
		insts := []metric.Observable{depth, oldest}
		if _, ok := cfg.Store.(outbox.StorageReporter); ok {
			g.live, err = m.Int64ObservableGauge(MetricStoreLiveRows, metric.WithDescription("Live rows of each of the store's tables (the database's estimate)."), metric.WithUnit("{row}"))
			errs = append(errs, err)
			g.dead, err = m.Int64ObservableGauge(MetricStoreDeadRows, metric.WithDescription("Dead row versions of each of the store's tables, not yet removed by a cleanup (the database's estimate)."), metric.WithUnit("{row}"))
			errs = append(errs, err)
			g.horizon, err = m.Int64ObservableGauge(MetricStoreHorizonAge, metric.WithDescription("Age of the oldest transaction ID the database's cleanup must keep (an open transaction, a replication slot), in transactions."), metric.WithUnit("{transaction}"))
			errs = append(errs, err)
			if err := errors.Join(errs...); err != nil {
				return nil, err
			}
			insts = append(insts, g.live, g.dead, g.horizon)
		}
		t.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			return t.observe(ctx, o, g)
		}, insts...)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// Close unregisters the gauges. The counters stay usable.
func (t *Telemetry) Close() error {
	if t.reg != nil {
		return t.reg.Unregister()
	}
	return nil
}

// gauges are the observable instruments; live, dead and horizon are nil
// unless the store implements outbox.StorageReporter.
type gauges struct {
	depth, live, dead, horizon metric.Int64ObservableGauge
	oldest                     metric.Float64ObservableGauge
}

func (t *Telemetry) observe(ctx context.Context, o metric.Observer, g gauges) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.GaugeTimeout)
	defer cancel()
	err := t.observeQueue(ctx, o, g.depth, g.oldest)
	if g.live != nil { // set only for an outbox.StorageReporter
		st, serr := t.cfg.Store.(outbox.StorageReporter).StorageStats(ctx)
		if serr != nil {
			return errors.Join(err, serr)
		}
		for _, tb := range st.Tables {
			attr := metric.WithAttributes(AttrTable.String(tb.Name))
			o.ObserveInt64(g.live, tb.LiveRows, attr)
			o.ObserveInt64(g.dead, tb.DeadRows, attr)
		}
		o.ObserveInt64(g.horizon, st.Horizon.AgeTransactions)
	}
	return err
}

func (t *Telemetry) observeQueue(ctx context.Context, o metric.Observer, depth metric.Int64ObservableGauge, oldest metric.Float64ObservableGauge) error {
	if a, ok := t.cfg.Store.(outbox.Admin); ok {
		stats, err := a.TopicStats(ctx, outbox.TopicStatsParams{})
		if err != nil {
			return err
		}
		now := time.Now()
		totals := map[outbox.Status]int64{}
		for _, s := range stats {
			for st, n := range s.Counts {
				totals[st] += n
			}
			o.ObserveFloat64(oldest, s.OldestPendingAge(now).Seconds(), metric.WithAttributes(AttrTopic.String(s.Topic)))
		}
		for _, st := range outbox.Statuses() {
			o.ObserveInt64(depth, totals[st], metric.WithAttributes(AttrStatus.String(string(st))))
		}
		return nil
	}
	counts, err := t.cfg.Store.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
	if err != nil {
		return err
	}
	for _, st := range outbox.Statuses() {
		o.ObserveInt64(depth, counts[st], metric.WithAttributes(AttrStatus.String(string(st))))
	}
	return nil
}

// InjectHeaders writes the span context of ctx into headers (traceparent,
// tracestate), unless the caller already set a traceparent or ctx carries
// no valid span. It implements outbox.HeaderInjector.
func (t *Telemetry) InjectHeaders(ctx context.Context, headers map[string]string) {
	if _, ok := headers["traceparent"]; ok {
		return
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	t.prop.Inject(ctx, propagation.MapCarrier(headers))
}

// SpanContextOf returns the span context stored in m's headers at enqueue
// (invalid when there is none).
func (t *Telemetry) SpanContextOf(m *outbox.Message) trace.SpanContext {
	if len(m.Headers) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
}

// Extract returns ctx carrying the span context found in headers (the
// headers of a received NATS, AMQP or Kafka message, as a map with the
// names as sent), so a consumer's spans continue the publish span's trace.
// ctx is returned as it is when the headers carry none. An HTTP receiver
// extracts with propagation.HeaderCarrier(r.Header) instead.
func (t *Telemetry) Extract(ctx context.Context, headers map[string]string) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier(headers))
}

func topicAttr(m *outbox.Message) metric.MeasurementOption {
	return metric.WithAttributes(AttrTopic.String(m.Topic))
}

func errorCode(m *outbox.Message, err error) string {
	if ei := outbox.ErrorInfoOf(err); ei != nil && ei.Code != "" {
		return ei.Code
	}
	if m.LastError != nil && m.LastError.Code != "" {
		return m.LastError.Code
	}
	return "unknown"
}

// OnEnqueued counts new messages.
func (t *Telemetry) OnEnqueued(ctx context.Context, e outbox.EnqueuedEvent) {
	if !e.Existed {
		t.enqueued.Add(ctx, 1, topicAttr(&e.Message))
	}
}

// OnBlockedByPolicy does nothing.
func (t *Telemetry) OnBlockedByPolicy(context.Context, outbox.BlockedEvent) {}

// OnAttemptStarted does nothing: the publish span is started by the
// publisher wrapper, which sees the context handed to the publisher.
func (t *Telemetry) OnAttemptStarted(context.Context, outbox.AttemptEvent) {}

// OnAttemptFinished records the publish latency and counts failures and
// retries.
func (t *Telemetry) OnAttemptFinished(ctx context.Context, e outbox.AttemptEvent) {
	t.publishLatency.Record(ctx, e.Duration.Seconds(), topicAttr(&e.Message))
	if e.Outcome == outbox.AttemptSucceeded {
		return
	}
	attrs := metric.WithAttributes(AttrTopic.String(e.Message.Topic), AttrErrorCode.String(errorCode(&e.Message, e.Err)))
	t.failed.Add(ctx, 1, attrs)
	if e.Outcome == outbox.AttemptRetry {
		t.retried.Add(ctx, 1, attrs)
	}
}

// OnSent counts a published message and its enqueue-to-publish time.
func (t *Telemetry) OnSent(ctx context.Context, e outbox.AttemptEvent) {
	t.published.Add(ctx, 1, topicAttr(&e.Message))
	if !e.Message.CreatedAt.IsZero() {
		at := e.StartedAt.Add(e.Duration)
		t.commitToPublish.Record(ctx, max(at.Sub(e.Message.CreatedAt), 0).Seconds(), topicAttr(&e.Message))
	}
}

// OnFailed counts a dead letter.
func (t *Telemetry) OnFailed(ctx context.Context, e outbox.AttemptEvent) {
	t.dead.Add(ctx, 1, metric.WithAttributes(AttrTopic.String(e.Message.Topic), AttrErrorCode.String(errorCode(&e.Message, e.Err))))
}

// OnClaimed records claim latency and batch size.
func (t *Telemetry) OnClaimed(ctx context.Context, e outbox.ClaimEvent) {
	ctx = context.WithoutCancel(ctx)
	if e.Err != nil {
		t.claimErrors.Add(ctx, 1)
		return
	}
	t.claimLatency.Record(ctx, e.Duration.Seconds())
	t.claimBatch.Record(ctx, int64(e.Claimed))
}

// OnDeliveryUpdated counts the receipt and records a span "receipt
// <status>" in ctx's trace (the webhook request), linked to the message's
// stored trace context.
func (t *Telemetry) OnDeliveryUpdated(ctx context.Context, e outbox.DeliveryEvent) {
	status := string(e.Message.Status)
	t.receipts.Add(ctx, 1, metric.WithAttributes(AttrStatus.String(status)))
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "outbox"),
			attribute.String("messaging.destination.name", e.Message.Topic),
			attribute.String("messaging.message.id", e.Message.ID),
			attribute.String("outbox.provider_message_id", e.Message.ProviderMessageID),
			attribute.String("outbox.status.previous", string(e.Previous)),
			attribute.String("outbox.status", status),
		),
	}
	if sc := t.SpanContextOf(&e.Message); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{Attributes: []attribute.KeyValue{attribute.String("outbox.link", "enqueue")}, SpanContext: sc}))
	}
	_, span := t.tracer.Start(ctx, "receipt "+status, opts...)
	if e.Message.Status == outbox.StatusFailed && e.Message.LastError != nil {
		span.SetStatus(codes.Error, e.Message.LastError.Code)
	}
	span.End()
}

// Publisher wraps pub: every message gets a producer span "publish
// <topic>", a child of the trace context stored at enqueue and linked to
// it, ended with the message's result; the message handed to pub carries
// the publish span's traceparent in a copy of its headers. Deferrals are
// counted here.
func (t *Telemetry) Publisher(pub outbox.Publisher) outbox.Publisher {
	return &publisher{t: t, pub: pub}
}

type publisher struct {
	t   *Telemetry
	pub outbox.Publisher
}

// Topics forwards the wrapped publisher's topics (outbox.Router has them).
func (p *publisher) Topics() []string {
	if tp, ok := p.pub.(interface{ Topics() []string }); ok {
		return tp.Topics()
	}
	return nil
}

// Validate forwards the wrapped publisher's start-up check (outbox.Router
// has one), so the processor still refuses an empty router behind it.
func (p *publisher) Validate() error {
	if v, ok := p.pub.(interface{ Validate() error }); ok {
		return v.Validate()
	}
	return nil
}

func (p *publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	spans := make([]trace.Span, len(msgs))
	out := make([]outbox.Message, len(msgs))
	for i := range msgs {
		m := msgs[i]
		parent := p.t.SpanContextOf(&m)
		sctx := ctx
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", "outbox"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", m.Topic),
				attribute.String("messaging.message.id", m.ID),
				attribute.Int("outbox.attempt", m.Attempts),
			),
		}
		if m.Group != "" {
			opts = append(opts, trace.WithAttributes(attribute.String("outbox.group", m.Group)))
		}
		if parent.IsValid() {
			sctx = trace.ContextWithRemoteSpanContext(ctx, parent)
			opts = append(opts, trace.WithLinks(trace.Link{Attributes: []attribute.KeyValue{attribute.String("outbox.link", "enqueue")}, SpanContext: parent}))
		}
		sctx, spans[i] = p.t.tracer.Start(sctx, "publish "+m.Topic, opts...)
		h := make(map[string]string, len(m.Headers)+2)
		for k, v := range m.Headers {
			h[k] = v
		}
		delete(h, "traceparent")
		delete(h, "tracestate")
		p.t.prop.Inject(sctx, propagation.MapCarrier(h))
		m.Headers = h
		out[i] = m
	}
	res := p.pub.Publish(ctx, out)
	for i, span := range spans {
		if i < len(res) {
			r := res[i]
			var de *outbox.DeferError
			switch {
			case r.Err == nil:
				if r.ProviderMessageID != "" {
					span.SetAttributes(attribute.String("outbox.provider_message_id", r.ProviderMessageID))
				}
				span.SetStatus(codes.Ok, "")
			case errors.As(r.Err, &de):
				p.t.deferred.Add(ctx, 1, metric.WithAttributes(AttrTopic.String(msgs[i].Topic), AttrErrorCode.String(errorCode(&msgs[i], r.Err))))
				span.SetAttributes(attribute.Bool("outbox.deferred", true))
			case errors.Is(r.Err, outbox.ErrNotAttempted):
				span.SetAttributes(attribute.Bool("outbox.not_attempted", true))
			default:
				span.SetStatus(codes.Error, errorCode(&msgs[i], r.Err))
			}
		}
		span.End()
	}
	return res
}
