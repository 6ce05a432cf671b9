package outbox

import (
	"fmt"
	"time"
)

// DeliveryStatus is what a provider receipt says about a message.
type DeliveryStatus string

// The delivery statuses a provider reports.
const (
	DeliverySent      DeliveryStatus = "sent"
	DeliveryDelivered DeliveryStatus = "delivered"
	DeliveryRead      DeliveryStatus = "read"
	DeliveryFailed    DeliveryStatus = "failed"
)

// Event returns the state-machine event for d.
func (d DeliveryStatus) Event() (Event, error) {
	switch d {
	case DeliverySent:
		return EventReceiptSent, nil
	case DeliveryDelivered:
		return EventReceiptDelivered, nil
	case DeliveryRead:
		return EventReceiptRead, nil
	case DeliveryFailed:
		return EventReceiptFailed, nil
	}
	return "", fmt.Errorf("%w: unknown delivery status %q", ErrInvalidInput, string(d))
}

// Receipt is a provider's delivery report for one message, found by its
// provider message ID within one tenant.
type Receipt struct {
	// Tenant scopes the lookup: a receipt never touches another tenant's
	// message.
	Tenant string
	// ProviderMessageID is the ID the publisher returned (e.g. a wamid).
	ProviderMessageID string
	// Status is the reported delivery status.
	Status DeliveryStatus
	// At is when the provider says it happened. Defaults to the store's
	// clock.
	At time.Time
	// Error describes a failed delivery.
	Error *ErrorInfo
}

// ApplyReceipt returns m after receipt r, and whether anything changed. It is
// the one rule every store uses: receipts are idempotent, may arrive out of
// order or twice, and never move a message backwards (DELIVERED never returns
// to SENT; FAILED and CANCELLED are never touched). A receipt that the state
// machine refuses is ignored (changed = false), not an error; an unknown
// delivery status is an error.
func ApplyReceipt(m Message, r Receipt) (Message, bool, error) {
	ev, err := r.Status.Event()
	if err != nil {
		return m, false, err
	}
	to, err := Transition(m.Status, ev)
	if err != nil {
		return m, false, nil //nolint:nilerr // a refused receipt is ignored by design
	}
	at := r.At
	if at.IsZero() {
		at = SystemClock.Now() // stores stamp At with their own Clock first
	}
	changed := false
	if to != m.Status {
		m.Status = to
		changed = true
	}
	switch r.Status {
	case DeliverySent:
		if m.SentAt.IsZero() && !at.IsZero() {
			m.SentAt, changed = at, true
		}
	case DeliveryDelivered:
		if m.DeliveredAt.IsZero() {
			m.DeliveredAt, changed = at, true
		}
	case DeliveryRead:
		if m.DeliveredAt.IsZero() {
			m.DeliveredAt, changed = at, true
		}
		if m.ReadAt.IsZero() {
			m.ReadAt, changed = at, true
		}
	case DeliveryFailed:
		if r.Error != nil {
			e := *r.Error
			m.LastError = &e
		} else {
			m.LastError = &ErrorInfo{Code: "delivery_failed", Message: "the provider reported the delivery as failed"}
		}
	}
	if changed {
		m.UpdatedAt = at
	}
	return m, changed, nil
}
