package outbox

import (
	"errors"
	"fmt"
)

// Status is the lifecycle state of a message. The zero value is not a valid
// status. See Transition for the allowed moves and docs/state_machine.md for
// the diagram.
type Status string

// The statuses a message moves through. The seeds' names map as QUEUED =
// PENDING, SENDING = PROCESSING, SENT/COMPLETED = SENT.
const (
	// StatusPending: waiting to be claimed, possibly not before NextAttemptAt.
	StatusPending Status = "PENDING"
	// StatusProcessing: claimed by a processor (leased), being published.
	StatusProcessing Status = "PROCESSING"
	// StatusSent: accepted by the publisher (the provider has it).
	StatusSent Status = "SENT"
	// StatusDelivered: the provider confirmed delivery (a read receipt keeps
	// this status and sets ReadAt).
	StatusDelivered Status = "DELIVERED"
	// StatusFailed: dead letter. Terminal except for an explicit requeue
	// (back to PENDING) or cancel (CANCELLED: given up for good).
	StatusFailed Status = "FAILED"
	// StatusCancelled: cancelled before it was published. Terminal.
	StatusCancelled Status = "CANCELLED"
)

// Statuses returns every status, in lifecycle order.
func Statuses() []Status {
	return []Status{StatusPending, StatusProcessing, StatusSent, StatusDelivered, StatusFailed, StatusCancelled}
}

// Valid reports whether s is one of the statuses returned by Statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusProcessing, StatusSent, StatusDelivered, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// Finished reports whether the processor is done with a message in status s:
// it was handed to the provider (SENT, DELIVERED) or it ended (FAILED,
// CANCELLED). Only finished messages are pruned.
func (s Status) Finished() bool {
	return s == StatusSent || s == StatusDelivered || s == StatusFailed || s == StatusCancelled
}

// Event is what happens to a message; Transition maps (Status, Event) to the
// next Status.
type Event string

// The events of the state machine.
const (
	EventClaim            Event = "claim"             // a processor leases the message
	EventPublished        Event = "published"         // the publisher accepted it
	EventRetry            Event = "retry"             // a retryable failure: back to PENDING with a NextAttemptAt
	EventDeadLetter       Event = "dead_letter"       // a permanent failure or attempts exhausted
	EventRelease          Event = "release"           // claimed but not started (shutdown, group blocked): back to PENDING
	EventLeaseExpired     Event = "lease_expired"     // the processor died: recovery puts it back to PENDING
	EventCancel           Event = "cancel"            // an operator or the application cancels it (PENDING, or a dead letter given up)
	EventRequeue          Event = "requeue"           // an operator retries a dead letter
	EventReceiptSent      Event = "receipt_sent"      // provider receipt: sent
	EventReceiptDelivered Event = "receipt_delivered" // provider receipt: delivered
	EventReceiptRead      Event = "receipt_read"      // provider receipt: read (recorded, status stays DELIVERED)
	EventReceiptFailed    Event = "receipt_failed"    // provider receipt: failed after it was sent
)

// Events returns every event.
func Events() []Event {
	return []Event{
		EventClaim, EventPublished, EventRetry, EventDeadLetter, EventRelease,
		EventLeaseExpired, EventCancel, EventRequeue, EventReceiptSent,
		EventReceiptDelivered, EventReceiptRead, EventReceiptFailed,
	}
}

// ErrInvalidTransition is returned (wrapped) by Transition, and by store
// operations such as Requeue or Cancel, when the message's current status does
// not allow the move.
var ErrInvalidTransition = errors.New("outbox: invalid status transition")

// transitions is the whole state machine. A receipt that would move a message
// backwards (DELIVERED + sent) is allowed as a no-op so that late and
// repeated receipts are accepted idempotently.
var transitions = map[Status]map[Event]Status{
	StatusPending: {
		EventClaim:  StatusProcessing,
		EventCancel: StatusCancelled,
	},
	StatusProcessing: {
		EventPublished:    StatusSent,
		EventRetry:        StatusPending,
		EventDeadLetter:   StatusFailed,
		EventRelease:      StatusPending,
		EventLeaseExpired: StatusPending,
	},
	StatusSent: {
		EventReceiptSent:      StatusSent,
		EventReceiptDelivered: StatusDelivered,
		EventReceiptRead:      StatusDelivered,
		EventReceiptFailed:    StatusFailed,
	},
	StatusDelivered: {
		EventReceiptSent:      StatusDelivered,
		EventReceiptDelivered: StatusDelivered,
		EventReceiptRead:      StatusDelivered,
	},
	StatusFailed: {
		EventRequeue: StatusPending,
		EventCancel:  StatusCancelled,
	},
	StatusCancelled: {},
}

// Transition returns the status a message in status from moves to on event
// ev, or an error wrapping ErrInvalidTransition when the move is not allowed.
// FAILED and CANCELLED are terminal (FAILED leaves only by EventRequeue or
// EventCancel);
// receipts never move a message backwards.
func Transition(from Status, ev Event) (Status, error) {
	if to, ok := transitions[from][ev]; ok {
		return to, nil
	}
	return from, fmt.Errorf("%w: %s on %s", ErrInvalidTransition, ev, from)
}
