package outbox

import (
	"context"
	"time"
)

// Observer receives lifecycle hooks: the host wires them to its audit trail,
// activity timeline, metrics or tracing. Hooks are called synchronously on
// the processor's (or the enqueuing caller's) goroutine, so they must be fast
// and must not block; a hook must not panic. Embed NopObserver to implement
// only the hooks you need; new hooks may be added in minor releases.
type Observer interface {
	// OnEnqueued is called after Enqueue inserted (or found) a message.
	// The message is not committed yet when it was enqueued in the caller's
	// transaction.
	OnEnqueued(ctx context.Context, e EnqueuedEvent)
	// OnBlockedByPolicy is called when a Policy refused a message.
	OnBlockedByPolicy(ctx context.Context, e BlockedEvent)
	// OnAttemptStarted is called before a batch is published, once per
	// message.
	OnAttemptStarted(ctx context.Context, e AttemptEvent)
	// OnAttemptFinished is called once per message after its outcome was
	// recorded.
	OnAttemptFinished(ctx context.Context, e AttemptEvent)
	// OnSent is called when a message reached SENT.
	OnSent(ctx context.Context, e AttemptEvent)
	// OnFailed is called when a message was dead-lettered (FAILED).
	OnFailed(ctx context.Context, e AttemptEvent)
	// OnDeliveryUpdated is called when a receipt changed a message.
	OnDeliveryUpdated(ctx context.Context, e DeliveryEvent)
}

// ClaimObserver is an optional Observer capability: OnClaimed is called
// after every claim the processor made (also an empty or failed one), for
// claim latency and batch size metrics. Observers forwards it to the
// observers that implement it.
type ClaimObserver interface {
	OnClaimed(ctx context.Context, e ClaimEvent)
}

// ClaimEvent describes one claim.
type ClaimEvent struct {
	// Limit is how many messages the claim asked for.
	Limit int
	// Claimed is how many it got.
	Claimed int
	// Duration is how long the store took.
	Duration time.Duration
	// Err is the store's error, if the claim failed.
	Err error
}

// EnqueuedEvent describes an enqueue.
type EnqueuedEvent struct {
	Message Message
	Existed bool
}

// BlockedEvent describes a message refused by a Policy.
type BlockedEvent struct {
	Message Message
	Err     error
}

// AttemptEvent describes one publish attempt of one message.
type AttemptEvent struct {
	Message Message
	// Attempt is the attempt number (1-based).
	Attempt int
	// Outcome is set on OnAttemptFinished, OnSent and OnFailed.
	Outcome AttemptOutcome
	// Err is the publish error, if any.
	Err error
	// NextAttemptAt is set when the message will be retried.
	NextAttemptAt time.Time
	StartedAt     time.Time
	Duration      time.Duration
}

// DeliveryEvent describes a receipt that changed a message.
type DeliveryEvent struct {
	Message  Message
	Previous Status
	Receipt  Receipt
}

// NopObserver implements Observer with no-ops; embed it.
type NopObserver struct{}

// OnEnqueued implements Observer: does nothing.
func (NopObserver) OnEnqueued(context.Context, EnqueuedEvent) {}

// OnBlockedByPolicy implements Observer: does nothing.
func (NopObserver) OnBlockedByPolicy(context.Context, BlockedEvent) {}

// OnAttemptStarted implements Observer: does nothing.
func (NopObserver) OnAttemptStarted(context.Context, AttemptEvent) {}

// OnAttemptFinished implements Observer: does nothing.
func (NopObserver) OnAttemptFinished(context.Context, AttemptEvent) {}

// OnSent implements Observer: does nothing.
func (NopObserver) OnSent(context.Context, AttemptEvent) {}

// OnFailed implements Observer: does nothing.
func (NopObserver) OnFailed(context.Context, AttemptEvent) {}

// OnDeliveryUpdated implements Observer: does nothing.
func (NopObserver) OnDeliveryUpdated(context.Context, DeliveryEvent) {}

// Observers fans hooks out to several observers, in order.
type Observers []Observer

// OnEnqueued implements Observer: calls each observer in order.
func (os Observers) OnEnqueued(ctx context.Context, e EnqueuedEvent) {
	for _, o := range os {
		o.OnEnqueued(ctx, e)
	}
}

// OnBlockedByPolicy implements Observer: calls each observer in order.
func (os Observers) OnBlockedByPolicy(ctx context.Context, e BlockedEvent) {
	for _, o := range os {
		o.OnBlockedByPolicy(ctx, e)
	}
}

// OnAttemptStarted implements Observer: calls each observer in order.
func (os Observers) OnAttemptStarted(ctx context.Context, e AttemptEvent) {
	for _, o := range os {
		o.OnAttemptStarted(ctx, e)
	}
}

// OnAttemptFinished implements Observer: calls each observer in order.
func (os Observers) OnAttemptFinished(ctx context.Context, e AttemptEvent) {
	for _, o := range os {
		o.OnAttemptFinished(ctx, e)
	}
}

// OnSent implements Observer: calls each observer in order.
func (os Observers) OnSent(ctx context.Context, e AttemptEvent) {
	for _, o := range os {
		o.OnSent(ctx, e)
	}
}

// OnFailed implements Observer: calls each observer in order.
func (os Observers) OnFailed(ctx context.Context, e AttemptEvent) {
	for _, o := range os {
		o.OnFailed(ctx, e)
	}
}

// OnDeliveryUpdated implements Observer: calls each observer in order.
func (os Observers) OnDeliveryUpdated(ctx context.Context, e DeliveryEvent) {
	for _, o := range os {
		o.OnDeliveryUpdated(ctx, e)
	}
}

// OnClaimed forwards the claim to the observers that implement
// ClaimObserver.
// OnClaimed implements Observer: calls each observer in order.
func (os Observers) OnClaimed(ctx context.Context, e ClaimEvent) {
	for _, o := range os {
		if c, ok := o.(ClaimObserver); ok {
			c.OnClaimed(ctx, e)
		}
	}
}
