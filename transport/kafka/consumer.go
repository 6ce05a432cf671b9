package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultRetryDelay is ConsumerConfig.RetryDelay's default.
const DefaultRetryDelay = time.Second

// Delivery is one consumed record, with the outbox fields the Publisher put
// in its headers.
type Delivery struct {
	// ID is the outbox message ID (HeaderID). A record without it (not
	// produced by a Publisher) gets "kafka:<topic>/<partition>/<offset>".
	ID string
	// Tenant, Topic and Group are the outbox message's (HeaderTenant,
	// HeaderTopic, HeaderGroup); Topic is the Kafka topic when the header
	// is missing.
	Tenant, Topic, Group string
	// Seq is the store-assigned sequence (HeaderSeq), 0 when missing.
	Seq int64
	// Headers holds every record header (the last value of a repeated
	// name), including trace context such as "traceparent".
	Headers map[string]string
	// Payload is the record's value.
	Payload []byte
	// Record is the consumed record.
	Record *kgo.Record
}

// ConsumerConfig configures a Consumer. TTx is the consumer's transaction
// type (e.g. *sql.Tx), the one its inbox store works with.
type ConsumerConfig[TTx any] struct {
	// Client consumes the records. Required. It must be a consumer group
	// client (kgo.ConsumerGroup, kgo.ConsumeTopics) with automatic commits
	// disabled (kgo.DisableAutoCommit): the Consumer commits offsets itself.
	// kgo.BlockRebalanceOnPoll is recommended (the Consumer allows the
	// rebalance after each commit), so a partition is not handed to another
	// member in the middle of a fetch.
	Client *kgo.Client
	// Inbox records each handled message in the consumer's transaction.
	// Required.
	Inbox *outbox.Inbox[TTx]
	// Name names this consumer in the inbox. Required.
	Name string
	// InTx runs fn in a new transaction and commits it when fn returns nil
	// (rolls back otherwise), e.g. a store's InTx method. Required.
	InTx func(ctx context.Context, fn func(tx TTx) error) error
	// Handle applies one delivery in tx. Required. It runs once per message
	// and consumer, whatever the number of deliveries; an error rolls tx
	// back and the delivery is handled again after RetryDelay.
	Handle func(ctx context.Context, tx TTx, d Delivery) error
	// OnHandled, when set, is called after Handle ran and its transaction
	// committed.
	OnHandled func(d Delivery)
	// OnDuplicate, when set, is called after a delivery the inbox recognised
	// as already handled (and acknowledged without running Handle).
	OnDuplicate func(d Delivery)
	// RetryDelay is the wait before handling a failed delivery again.
	// Defaults to 1s.
	RetryDelay time.Duration
	// Logger receives handler failures and skipped records. Defaults to
	// discarding them.
	Logger *slog.Logger
}

// Consumer hands Kafka records to a handler through an outbox.Inbox, each in
// the consumer's own database transaction, and commits a record's offset
// only after that transaction committed. A record delivered again (the
// outbox publishes at least once; Kafka redelivers after a rebalance or a
// crash before the offset commit) is recognised by the inbox and not
// handled twice.
//
// Records of a partition are handled one after the other, in offset order,
// so a group's messages (one partition, by key) are applied in order. A
// failing Handle is retried after RetryDelay, holding back the rest of its
// partition's fetch; a record whose inbox identity is invalid (an ID header
// longer than outbox.MaxKeyLength, say) can never be recorded and is
// logged and skipped.
type Consumer[TTx any] struct {
	cfg ConsumerConfig[TTx]
	log *slog.Logger
}

// NewConsumer returns a Consumer, or an error naming the first invalid
// ConsumerConfig field.
func NewConsumer[TTx any](cfg ConsumerConfig[TTx]) (*Consumer[TTx], error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("kafka: ConsumerConfig.Client is required")
	case cfg.Inbox == nil:
		return nil, errors.New("kafka: ConsumerConfig.Inbox is required")
	case cfg.Name == "":
		return nil, errors.New("kafka: ConsumerConfig.Name is required")
	case cfg.InTx == nil:
		return nil, errors.New("kafka: ConsumerConfig.InTx is required")
	case cfg.Handle == nil:
		return nil, errors.New("kafka: ConsumerConfig.Handle is required")
	case cfg.RetryDelay < 0:
		return nil, errors.New("kafka: ConsumerConfig.RetryDelay must not be negative")
	}
	if g, _ := cfg.Client.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return nil, errors.New("kafka: ConsumerConfig.Client must consume in a group (kgo.ConsumerGroup)")
	}
	if off, _ := cfg.Client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, errors.New("kafka: ConsumerConfig.Client must not commit automatically (kgo.DisableAutoCommit): " +
			"an offset committed before the handler's transaction would lose the record on a crash")
	}
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Consumer[TTx]{cfg: cfg, log: log}, nil
}

// Run consumes until ctx ends, then commits the offsets of what it handled
// and returns nil. It returns an error when the client is closed under it.
// Cancelling ctx interrupts a Handle that honours it; its transaction rolls
// back and the record is consumed again by the next Run.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	cl := c.cfg.Client
	// With kgo.BlockRebalanceOnPoll, a rebalance (and the client's Close)
	// waits until the records of the last poll are let go.
	defer cl.AllowRebalance()
	for {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			return errors.New("kafka: the consumer's client was closed")
		}
		if ctx.Err() != nil {
			return nil
		}
		failed := false
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				failed = true
				c.log.Warn("fetch failed", "topic", topic, "partition", partition, "err", err)
			}
		})
		if failed && fetches.NumRecords() == 0 {
			// A lasting error (authorization, a deleted topic) would
			// otherwise make the poll loop spin.
			t := time.NewTimer(c.cfg.RetryDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		var done []*kgo.Record
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range p.Records {
				if !c.handle(ctx, r) {
					return // ctx ended: the rest of the partition waits for the next Run
				}
				done = append(done, r)
			}
		})
		if len(done) > 0 {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			if err := cl.CommitRecords(cctx, done...); err != nil {
				// The records come back (after a rebalance or a restart)
				// and the inbox drops them.
				c.log.Warn("offset commit failed", "records", len(done), "err", err)
			}
			cancel()
		}
		cl.AllowRebalance()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// handle applies r until it succeeds or is skipped (true), or ctx ends
// (false).
func (c *Consumer[TTx]) handle(ctx context.Context, r *kgo.Record) bool {
	d := delivery(r)
	for {
		ran := false
		err := c.cfg.InTx(ctx, func(tx TTx) error {
			var err error
			ran, err = c.cfg.Inbox.HandleTx(ctx, tx, c.cfg.Name, d.Tenant, d.ID, func(ctx context.Context) error {
				return c.cfg.Handle(ctx, tx, d)
			})
			return err
		})
		switch {
		case err == nil:
			if ran && c.cfg.OnHandled != nil {
				c.cfg.OnHandled(d)
			}
			if !ran && c.cfg.OnDuplicate != nil {
				c.cfg.OnDuplicate(d)
			}
			return true
		case errors.Is(err, outbox.ErrInvalidInput):
			c.log.Error("record skipped: it cannot be recorded in the inbox", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return true
		case ctx.Err() != nil:
			return false
		}
		c.log.Warn("handler failed; retrying", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", d.ID, "retry_in", c.cfg.RetryDelay, "err", err)
		t := time.NewTimer(c.cfg.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// delivery reads the outbox fields of r.
func delivery(r *kgo.Record) Delivery {
	d := Delivery{Topic: r.Topic, Payload: r.Value, Record: r, Headers: make(map[string]string, len(r.Headers))}
	for _, h := range r.Headers {
		d.Headers[h.Key] = string(h.Value)
	}
	d.ID = d.Headers[HeaderID]
	if d.ID == "" {
		d.ID = fmt.Sprintf("kafka:%s/%d/%d", r.Topic, r.Partition, r.Offset)
	}
	d.Tenant = d.Headers[HeaderTenant]
	if t := d.Headers[HeaderTopic]; t != "" {
		d.Topic = t
	}
	d.Group = d.Headers[HeaderGroup]
	d.Seq, _ = strconv.ParseInt(d.Headers[HeaderSeq], 10, 64)
	return d
}
