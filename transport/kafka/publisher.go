package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// Defaults of Config.
const (
	DefaultDeliveryTimeout = 30 * time.Second
	DefaultMaxInFlight     = 1000
)

// Header names the Publisher sets on every record, after the message's own
// Headers (which carry trace context such as "traceparent" as they are).
const (
	HeaderID          = "outbox-id"
	HeaderTenant      = "outbox-tenant" // set when the message has a tenant
	HeaderTopic       = "outbox-topic"
	HeaderGroup       = "outbox-group" // set when the message has a group
	HeaderSeq         = "outbox-seq"   // the store-assigned sequence, decimal
	HeaderContentType = "content-type" // the message's content type (application/json by default)
)

// Producer is the part of *kgo.Client the Publisher uses.
type Producer interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// Config configures a Publisher.
type Config struct {
	// Client produces the records. Required. Create it with kgo.NewClient
	// on a client you own (and close). When it is a *kgo.Client, New checks
	// that it writes idempotently (the default) and requires acks from all
	// in-sync replicas (the default), unless AllowWeakDurability is set.
	Client Producer
	// Topic returns the Kafka topic a message is produced to. An error fails
	// the message permanently (code "topic"). Defaults to TopicPrefix
	// followed by the message's Topic.
	Topic func(m *outbox.Message) (string, error)
	// TopicPrefix is put before the Topic by the default Topic function, e.g.
	// "outbox." produces topic "orders" to "outbox.orders". Defaults to "".
	TopicPrefix string
	// DeliveryTimeout bounds how long a record may wait to be produced (a
	// broker that is down, a partition without a leader). A record that was
	// sent and not yet answered is waited for (the idempotent producer
	// cannot give it up safely). Defaults to 30s.
	DeliveryTimeout time.Duration
	// MaxInFlight is the most records produced and not yet acknowledged at
	// a time by one Publish call. Defaults to 1000.
	MaxInFlight int
	// AllowWeakDurability lets New accept a *kgo.Client that does not write
	// idempotently or does not require acks from all in-sync replicas.
	// Defaults to false: such a client fails New, since a record it produces
	// may be lost or duplicated and reordered by the client's own retries.
	AllowWeakDurability bool
	// Pipeline produces every message of a batch at once, a group's records
	// one after another without waiting for acks, instead of in waves (see
	// Publisher, "Pipelined groups"). Deep groups then go out at close to
	// franz-go's own rate. It requires a *kgo.Client that writes
	// idempotently and flushes automatically. Defaults to false: franz-go
	// keeps a partition's order when a record fails in every case but a few
	// rare ones (a record produced into a partition after an earlier one of
	// its group failed, a change of the topic's partition count), which
	// Pipeline detects (OrderViolations) but cannot prevent.
	Pipeline bool
}

// Publisher produces outbox messages to Kafka with franz-go. It implements
// outbox.Publisher.
//
// # Records
//
// Each message becomes one record on the topic Config.Topic returns: the
// key is the message's Group (so a group always lands in the same partition,
// in order, under the default partitioner; an unordered message has no key),
// the value its Payload. The message's Headers are copied first, so trace
// context ("traceparent", "tracestate") travels with the record; then the
// Publisher sets HeaderID, HeaderTopic, HeaderSeq, HeaderContentType and,
// when not empty, HeaderTenant and HeaderGroup (replacing a message header
// of the same name).
//
// A message is sent once the partition leader acknowledges the record (with
// acks from all in-sync replicas under the default client configuration):
// ProviderMessageID is "topic/partition/offset" and ProviderResponse the
// same as JSON.
//
// # Outcomes
//
// Permanent (the message is dead-lettered at once): the topic function fails
// or returns an invalid topic name ("topic"), a record larger than the
// producer or the broker accepts ("too_large"), a record the broker rejects
// as invalid ("invalid_record", "kafka_<code>" for an invalid topic or
// request). Retryable: any other failure to produce, e.g. a broker error,
// the client's retries or DeliveryTimeout used up ("timeout"), an unknown
// topic ("unknown_topic"), a closed client ("closed").
//
// # Ordered groups and batching
//
// The records of a batch are produced asynchronously in waves: every
// unordered message and the first message of every ordered group go out at
// once (up to MaxInFlight), and the Publisher waits for all of them; then the
// second message of every group whose first succeeded, and so on. So no
// record of a group is produced while an earlier one of the group is
// unresolved, and at a group's first failure its later messages are not
// produced (outbox.ErrNotAttempted): the group's order holds across the batch
// and across the processor's retries. Within one wave, the client batches
// records into as few produce requests as it can.
//
// # Pipelined groups
//
// With Config.Pipeline, every message of the batch is handed to the client
// at once (up to MaxInFlight records unacknowledged), each group's records
// in group order, and the idempotent producer keeps them in order within
// their partition. Results follow the same rule as the waves: a group's
// first failed message gets its error, and every later message of the group
// that was not written gets outbox.ErrNotAttempted.
//
// Why the order holds (franz-go v1.22.2, pkg/kgo): a record buffered for a
// partition fails only together with every record buffered behind it, via
// recBuf.failAllRecords (sink.go 1884-1923): on a broker error or exhausted
// retries through finishBatch (sink.go 1316-1325), on a timeout, retry limit
// or cancelled first record through maybeFailErr (sink.go 1406-1411,
// 2284-2289, 1853-1855). A batch that was sent and not answered is never
// given up by an idempotent client (canFail, sink.go 1829; 1406; 2285), and
// a sequence error is resent under a new epoch rather than failed (sink.go
// 1122-1256, unless kgo.StopProducerOnDataLossDetected, which fails the
// partition's buffer as above, sink.go 1195-1209). And the broker rejects a
// batch whose sequence follows an unwritten one. So no record behind a
// failed one in its partition's buffer is written.
//
// What is not covered, so Pipeline is not the default: a record that fails
// alone before it is buffered or partitioned (producer.go 636-643 too large
// for MaxBufferedBytes, 650-655 buffer full under manual flushing, 729-736
// a context or the client ending while Produce blocks on MaxBufferedRecords,
// 916-918 and 959-962 no usable partition; sink.go 1735-1740 too large for a
// batch), a record that enters the partition's buffer after an earlier one
// of its group failed (before the failure reached the Publisher), and a
// group whose key maps to another partition after the topic gained
// partitions. The Publisher narrows these: it stops producing a group once
// one of its records failed or its delivery context ended; a record that
// must wait for room (MaxInFlight, or a full client buffer where Produce
// would block) is produced only once its group's earlier records resolved;
// it holds a group's later records back (outbox.ErrNotAttempted) behind a
// record of more than half the client's batch or buffer size; and New
// refuses manual flushing. What remains is a failure that reaches franz-go
// within the moment it takes to hand a group's records over, records of
// other users of the client filling its buffer between the Publisher's
// check and its Produce, and a change of partition count.
// A later message of a group that was written although an earlier one
// failed retryably is reported as sent (it was) and counted by
// OrderViolations: the earlier one, retried, lands after it. After a
// permanent failure a later message of the group may be written (the waves
// would hold it back until the failed one is dead-lettered).
//
// # Throughput
//
// In waves, give the Publisher a client with kgo.ProducerLinger(0): it waits
// for each wave's acks before the next, so franz-go's default linger (10ms)
// would delay every wave. A wave costs one broker round trip, so a batch of
// many groups goes out at close to franz-go's own rate, while a group's
// messages cost one round trip each: a processor publishing deep groups gets
// about MaxConcurrentGroups messages per round trip (raise outbox
// Config.MaxConcurrentGroups for more). Pipelined, deep groups go out at
// 50% to 100% of franz-go's own rate. BenchmarkPublish measures both against
// franz-go producing the same records directly (PERFORMANCE.md).
//
// # Cancellation
//
// When ctx ends, messages not yet produced get outbox.ErrNotAttempted joined
// with ctx.Err(); records handed to the client and not yet resolved get a
// retryable error ("canceled"): the broker may have written them, and the
// retry is a duplicate that a consumer drops with its inbox.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	client      Producer
	topic       func(m *outbox.Message) (string, error)
	timeout     time.Duration
	maxInFlight int
	pipeline    bool
	bigRecord   int64 // pipelined: a record larger than this holds its group's later records back
	maxBuffered int64 // pipelined: the client's MaxBufferedRecords
	violations  atomic.Int64
}

// New returns a Publisher, or an error naming the first invalid Config field.
func New(cfg Config) (*Publisher, error) {
	if cfg.Client == nil {
		return nil, errors.New("kafka: Config.Client is required")
	}
	if cfg.DeliveryTimeout < 0 {
		return nil, errors.New("kafka: Config.DeliveryTimeout must not be negative")
	}
	if cfg.MaxInFlight < 0 {
		return nil, errors.New("kafka: Config.MaxInFlight must not be negative")
	}
	if cfg.Topic != nil && cfg.TopicPrefix != "" {
		return nil, errors.New("kafka: set Config.Topic or Config.TopicPrefix, not both")
	}
	if cl, ok := cfg.Client.(*kgo.Client); ok && !cfg.AllowWeakDurability {
		if err := checkDurability(cl); err != nil {
			return nil, err
		}
	}
	var bigRecord, maxBuffered int64
	if cfg.Pipeline {
		cl, ok := cfg.Client.(*kgo.Client)
		if !ok {
			return nil, errors.New("kafka: Config.Pipeline requires a *kgo.Client")
		}
		if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
			return nil, errors.New("kafka: Config.Pipeline requires idempotent writes (the client's retries would reorder a group)")
		}
		if on, _ := cl.OptValue(kgo.ManualFlushing).(bool); on {
			return nil, errors.New("kafka: Config.Pipeline does not work with kgo.ManualFlushing (a record may fail alone when the buffer is full)")
		}
		bigRecord = 1 << 62
		if v, ok := cl.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && v > 0 {
			bigRecord = int64(v) / 2
		}
		if v, ok := cl.OptValue(kgo.MaxBufferedBytes).(int64); ok && v > 0 {
			bigRecord = min(bigRecord, v/2)
		}
		maxBuffered, _ = cl.OptValue(kgo.MaxBufferedRecords).(int64)
	}
	topic := cfg.Topic
	if topic == nil {
		prefix := cfg.TopicPrefix
		topic = func(m *outbox.Message) (string, error) { return prefix + m.Topic, nil }
	}
	return &Publisher{
		client:      cfg.Client,
		topic:       topic,
		timeout:     cmp.Or(cfg.DeliveryTimeout, DefaultDeliveryTimeout),
		maxInFlight: cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight),
		pipeline:    cfg.Pipeline,
		bigRecord:   bigRecord,
		maxBuffered: maxBuffered,
	}, nil
}

// OrderViolations returns how many messages, since New, were written to
// Kafka although an earlier message of their group in the same batch failed
// retryably (so that one, retried, lands after them). It stays 0 without
// Config.Pipeline; see Publisher, "Pipelined groups".
func (p *Publisher) OrderViolations() int64 { return p.violations.Load() }

// checkDurability refuses a client that may lose, duplicate or reorder
// records on its own retries.
func checkDurability(cl *kgo.Client) error {
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return errors.New("kafka: the client has idempotent writes disabled (kgo.DisableIdempotentWrite); " +
			"its retries may duplicate and reorder records (set Config.AllowWeakDurability to accept this)")
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		return errors.New("kafka: the client does not require acks from all in-sync replicas (kgo.RequiredAcks); " +
			"an acknowledged record may be lost (set Config.AllowWeakDurability to accept this)")
	}
	if on, _ := cl.OptValue(kgo.AllowIdempotentProduceCancellation).(bool); on {
		return errors.New("kafka: the client may cancel in-flight records (kgo.AllowIdempotentProduceCancellation); " +
			"a cancelled record may still be written (set Config.AllowWeakDurability to accept this)")
	}
	if v, _ := cl.OptValue(kgo.TransactionalID).(string); v != "" {
		return errors.New("kafka: the client is transactional (kgo.TransactionalID); the Publisher produces outside transactions")
	}
	return nil
}

// Publish produces msgs and returns one Result per message, in order. See
// Publisher for the outcomes, ordered groups and cancellation.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	if p.pipeline {
		return p.publishPipelined(ctx, msgs)
	}
	return outbox.PublishWaves(ctx, msgs, p.maxInFlight, func(ctx context.Context, idx []int, out []outbox.Result) {
		p.produceChunk(ctx, msgs, idx, out)
	})
}

type produced struct {
	j   int
	rec *kgo.Record
	err error
}

// produceChunk hands the records at idx to the client, then awaits their
// promises.
func (p *Publisher) produceChunk(ctx context.Context, msgs []outbox.Message, idx []int, out []outbox.Result) {
	done := make(chan produced, len(idx)) // buffered: a late promise never blocks
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	pending := 0
	for j, i := range idx {
		if err := ctx.Err(); err != nil {
			out[i].Err = errors.Join(outbox.ErrNotAttempted, err)
			continue
		}
		rec, err := p.record(&msgs[i])
		if err != nil {
			out[i].Err = err
			continue
		}
		pending++
		p.client.Produce(rctx, rec, func(r *kgo.Record, err error) { done <- produced{j: j, rec: r, err: err} })
	}
	got := make([]bool, len(idx))
	for ; pending > 0; pending-- {
		select {
		case d := <-done:
			got[d.j] = true
			i := idx[d.j]
			if d.err != nil {
				out[i].Err = p.classify(ctx, d.err)
				continue
			}
			out[i] = ackResult(d.rec)
		case <-ctx.Done():
			for j, i := range idx {
				if !got[j] && out[i].Err == nil {
					out[i].Err = &outbox.PublishError{Code: "canceled", Message: "the context ended before the broker answered", Err: ctx.Err()}
				}
			}
			return
		}
	}
}

// ackResult is the Result of a produced record: ProviderMessageID
// "topic/partition/offset" and ProviderResponse
// {"topic":...,"partition":...,"offset":...,"timestamp":...} (built by hand:
// this runs once per record).
func ackResult(r *kgo.Record) outbox.Result {
	id := make([]byte, 0, len(r.Topic)+24)
	id = append(id, r.Topic...)
	id = append(id, '/')
	id = strconv.AppendInt(id, int64(r.Partition), 10)
	id = append(id, '/')
	id = strconv.AppendInt(id, r.Offset, 10)
	resp := make([]byte, 0, len(r.Topic)+96)
	resp = append(resp, `{"topic":`...)
	resp = strconv.AppendQuote(resp, r.Topic) // topic names are [a-zA-Z0-9._-]: valid JSON
	resp = append(resp, `,"partition":`...)
	resp = strconv.AppendInt(resp, int64(r.Partition), 10)
	resp = append(resp, `,"offset":`...)
	resp = strconv.AppendInt(resp, r.Offset, 10)
	resp = append(resp, `,"timestamp":"`...)
	resp = r.Timestamp.UTC().AppendFormat(resp, time.RFC3339Nano)
	resp = append(resp, `"}`...)
	return outbox.Result{ProviderMessageID: string(id), ProviderResponse: resp}
}

// reserved reports whether k is one of the headers the Publisher sets
// (compared without case).
func reserved(k string) bool {
	if len(k) < len(HeaderID) || len(k) > len(HeaderTenant) { // the shortest and the longest
		return false
	}
	for _, h := range [...]string{HeaderID, HeaderTenant, HeaderTopic, HeaderGroup, HeaderSeq, HeaderContentType} {
		if strings.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// record builds the Kafka record of m.
func (p *Publisher) record(m *outbox.Message) (*kgo.Record, error) {
	topic, err := p.topic(m)
	if err != nil {
		return nil, outbox.Permanent("topic", "no topic for the message: "+redact.Printable(err.Error(), 300))
	}
	if !validTopic(topic) {
		// Quoted (a space or a control character in the name shows), at most
		// 100 characters of it.
		return nil, outbox.Permanent("topic", fmt.Sprintf("%.100q is not a valid Kafka topic name", topic))
	}
	hs := make([]kgo.RecordHeader, 0, len(m.Headers)+6)
	for k, v := range m.Headers {
		if !reserved(k) {
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	hs = append(hs, kgo.RecordHeader{Key: HeaderID, Value: []byte(m.ID)})
	if m.Tenant != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderTenant, Value: []byte(m.Tenant)})
	}
	hs = append(hs, kgo.RecordHeader{Key: HeaderTopic, Value: []byte(m.Topic)})
	if m.Group != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderGroup, Value: []byte(m.Group)})
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderSeq, Value: strconv.AppendInt(nil, m.Seq, 10)},
		kgo.RecordHeader{Key: HeaderContentType, Value: contentType(m)})
	r := &kgo.Record{Topic: topic, Value: m.Payload, Headers: hs}
	if m.Group != "" {
		r.Key = []byte(m.Group)
	}
	return r, nil
}

var contentTypeJSON = []byte(outbox.ContentTypeJSON)

// contentType is the value of HeaderContentType for m.
func contentType(m *outbox.Message) []byte {
	if m.ContentType == "" {
		return contentTypeJSON
	}
	return []byte(m.ContentType)
}

// classify maps a produce error to an outbox error. ctx is the Publish
// context.
func (p *Publisher) classify(ctx context.Context, err error) error {
	msg := redact.Printable(err.Error(), 500)
	var ke *kerr.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if ctx.Err() != nil {
			// The client gives up a record only when it was not sent.
			return errors.Join(outbox.ErrNotAttempted, ctx.Err())
		}
		return &outbox.PublishError{Code: "timeout", Message: "not produced within " + p.timeout.String(), Err: err}
	case errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, kgo.ErrRecordRetries):
		return &outbox.PublishError{Code: "timeout", Message: msg, Err: err}
	case errors.Is(err, kgo.ErrClientClosed):
		return &outbox.PublishError{Code: "closed", Message: msg, Err: err}
	case errors.Is(err, kgo.ErrMaxBuffered):
		return outbox.Defer(time.Second, "buffer_full", "the client holds the most records it may buffer")
	case errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge):
		return &outbox.PublishError{Code: "too_large", Message: msg, Permanent: true, Err: err}
	case errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage):
		return &outbox.PublishError{Code: "invalid_record", Message: msg, Permanent: true, Err: err}
	case errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID):
		return &outbox.PublishError{Code: "unknown_topic", Message: msg, Err: err}
	case errors.As(err, &ke):
		code := "kafka_" + strconv.Itoa(int(ke.Code))
		switch ke {
		case kerr.InvalidTopicException, kerr.InvalidRequiredAcks, kerr.InvalidTimestamp, kerr.UnsupportedForMessageFormat:
			return &outbox.PublishError{Code: code, Message: msg, Permanent: true, Err: err}
		}
		return &outbox.PublishError{Code: code, Message: msg, Err: err}
	default:
		return &outbox.PublishError{Code: "error", Message: msg, Err: err}
	}
}

// validTopic reports whether s is a legal Kafka topic name: 1 to 249
// characters of [a-zA-Z0-9._-], not "." or "..".
func validTopic(s string) bool {
	if s == "" || len(s) > 249 || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
