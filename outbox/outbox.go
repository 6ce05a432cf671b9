package outbox

import (
	"context"
	"errors"
	"fmt"
)

// Outbox is the enqueue side: it validates messages, checks the Policy,
// inserts through the store adapter (in the caller's transaction with
// EnqueueTx, or in its own with Enqueue) and notifies observers. TTx is the
// adapter's transaction type (*sql.Tx for store/sqlite, pgx.Tx for
// store/postgres, ...).
//
//	ob := outbox.New(store, outbox.Options{})
//	tx, _ := db.BeginTx(ctx, nil)
//	// ... business writes in tx ...
//	res, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: body})
//	// ... tx.Commit(): the message exists if and only if this commits.
type Outbox[TTx any] struct {
	store      Enqueuer[TTx]
	policy     Policy
	observer   Observer
	inject     HeaderInjector
	clock      Clock
	maxPayload int
	err        error // a misconfiguration, returned by every Enqueue
}

// Options configures an Outbox. The zero value is valid.
type Options struct {
	// Policy is checked for every message before it is inserted. Defaults
	// to none.
	Policy Policy
	// Observer receives OnEnqueued and OnBlockedByPolicy. Defaults to none.
	Observer Observer
	// Clock stamps CreatedAt. Defaults to SystemClock.
	Clock Clock
	// Headers adds headers to every message from the enqueuing context
	// before it is validated, e.g. the caller's trace context (outbox/otel
	// provides one). Defaults to none.
	Headers HeaderInjector
	// MaxPayloadBytes is the largest payload Enqueue accepts, in bytes; a
	// larger one is refused with a *PayloadTooLargeError naming the limit
	// (nothing is inserted). Defaults to DefaultMaxPayloadBytes (1 MiB). It
	// may be raised up to the store's ceiling (PayloadLimiter: 64 MiB for
	// store/postgres and store/sqlite, 16 MiB - 64 KiB for store/mysql and
	// store/mongo); a negative value or one above the ceiling is a
	// misconfiguration that every Enqueue reports (see Outbox.Err). Mind
	// memory: the processor holds up to Config.BufferSize claimed messages.
	MaxPayloadBytes int
}

// HeaderInjector adds headers to a message at enqueue, from the caller's
// context: the trace context (a W3C traceparent), a request ID, ... It is
// called once per message with the message's own copy of its headers (never
// nil) and must not overwrite a header the caller already set.
type HeaderInjector interface {
	InjectHeaders(ctx context.Context, headers map[string]string)
}

// New returns an Outbox over a store adapter. A misconfigured Options
// (MaxPayloadBytes negative or above the store's ceiling) does not panic:
// Err returns it, and so does every Enqueue and EnqueueTx.
func New[TTx any](store Enqueuer[TTx], opts Options) *Outbox[TTx] {
	o := &Outbox[TTx]{
		store: store, policy: opts.Policy, observer: opts.Observer, inject: opts.Headers, clock: opts.Clock,
		maxPayload: opts.MaxPayloadBytes,
	}
	if o.observer == nil {
		o.observer = NopObserver{}
	}
	if o.clock == nil {
		o.clock = SystemClock
	}
	if o.maxPayload == 0 {
		o.maxPayload = DefaultMaxPayloadBytes
	}
	switch ceiling := payloadCeiling(store); {
	case o.maxPayload < 0:
		o.err = invalid("Options.MaxPayloadBytes", fmt.Sprintf("must not be negative, got %d", o.maxPayload))
	case ceiling > 0 && o.maxPayload > ceiling:
		o.err = invalid("Options.MaxPayloadBytes", fmt.Sprintf("is %d, above the store's ceiling of %d bytes", o.maxPayload, ceiling))
	}
	return o
}

// payloadCeiling is the store's PayloadLimiter ceiling, or 0.
func payloadCeiling(store any) int {
	if l, ok := store.(PayloadLimiter); ok {
		return l.MaxPayloadBytes()
	}
	return 0
}

// Err reports a misconfiguration of the Options given to New (nil when
// there is none). Every Enqueue and EnqueueTx returns it before doing
// anything; a program may check it once at start.
func (o *Outbox[TTx]) Err() error { return o.err }

// MaxPayloadBytes returns the payload limit this Outbox enforces
// (Options.MaxPayloadBytes or its default).
func (o *Outbox[TTx]) MaxPayloadBytes() int { return o.maxPayload }

// Enqueue inserts msgs in a transaction of the store's own. It returns one
// Enqueued per message, in order. Nothing is inserted when any message is
// invalid (ErrInvalidInput) or refused by the policy (ErrBlockedByPolicy).
func (o *Outbox[TTx]) Enqueue(ctx context.Context, msgs ...Message) ([]Enqueued, error) {
	p, err := o.prepare(ctx, msgs)
	if err != nil || len(p.Messages) == 0 {
		return nil, err
	}
	res, err := o.store.MessageEnqueue(ctx, p)
	return o.finish(ctx, res, err)
}

// EnqueueTx inserts msgs in the caller's transaction tx: they are published
// if and only if tx commits. Invalid or refused messages are reported before
// any statement runs, so tx stays usable; a repeated idempotency key returns
// the first message (Existed = true) and also leaves tx usable.
func (o *Outbox[TTx]) EnqueueTx(ctx context.Context, tx TTx, msgs ...Message) ([]Enqueued, error) {
	p, err := o.prepare(ctx, msgs)
	if err != nil || len(p.Messages) == 0 {
		return nil, err
	}
	res, err := o.store.MessageEnqueueTx(ctx, tx, p)
	return o.finish(ctx, res, err)
}

func (o *Outbox[TTx]) prepare(ctx context.Context, msgs []Message) (MessageEnqueueParams, error) {
	if o.err != nil {
		return MessageEnqueueParams{}, o.err
	}
	now := o.clock.Now()
	out := make([]Message, len(msgs))
	for i := range msgs {
		m := msgs[i]
		m.Headers = cloneHeaders(m.Headers)
		if o.inject != nil {
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			o.inject.InjectHeaders(ctx, m.Headers)
			if len(m.Headers) == 0 {
				m.Headers = nil
			}
		}
		if err := prepareMessage(&m, now, o.maxPayload); err != nil {
			return MessageEnqueueParams{}, fmt.Errorf("message %d: %w", i, err)
		}
		if o.policy != nil {
			if err := o.policy.Check(ctx, &m); err != nil {
				var pe *PolicyError
				if errors.As(err, &pe) {
					c := *pe
					c.Index = i
					err = &c
				} else {
					err = &PolicyError{Code: "blocked", Reason: err.Error(), Index: i}
				}
				o.observer.OnBlockedByPolicy(ctx, BlockedEvent{Message: m, Err: err})
				return MessageEnqueueParams{}, err
			}
		}
		out[i] = m
	}
	return MessageEnqueueParams{Messages: out, Now: now, MaxPayloadBytes: o.maxPayload, prepared: &preparedBatch{msgs: out}}, nil
}

func (o *Outbox[TTx]) finish(ctx context.Context, res []Enqueued, err error) ([]Enqueued, error) {
	if err != nil {
		return nil, err
	}
	for i := range res {
		res[i].Message.ForgetGeneratedID()
		o.observer.OnEnqueued(ctx, EnqueuedEvent{Message: res[i].Message, Existed: res[i].Existed})
	}
	return res, nil
}

func cloneHeaders(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	c := make(map[string]string, len(h))
	for k, v := range h {
		c[k] = v
	}
	return c
}
