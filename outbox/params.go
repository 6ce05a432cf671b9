package outbox

import (
	"errors"
	"fmt"
	"time"
)

// MaxClaimLimit is the largest MessageClaimParams.Limit a store accepts.
const MaxClaimLimit = 10000

// Validate checks the claim's parameters: Limit between 1 and
// MaxClaimLimit, an Owner, and no empty topic. Every store calls it before
// it touches the database.
func (p MessageClaimParams) Validate() error {
	if p.Limit <= 0 || p.Limit > MaxClaimLimit {
		return invalid("Limit", fmt.Sprintf("must be between 1 and %d", MaxClaimLimit))
	}
	if p.Owner == "" {
		return invalid("Owner", "is required")
	}
	for _, t := range p.Topics {
		if t == "" {
			return invalid("Topics", "contains an empty topic")
		}
	}
	return nil
}

// Validate checks the batch of outcomes: an Owner, every outcome valid
// (see Outcome.Validate), and no message (Topic, ID) with two outcomes in
// the call.
func (p MessageFinishParams) Validate() error {
	if p.Owner == "" {
		return invalid("Owner", "is required")
	}
	type key struct{ topic, id string }
	seen := make(map[key]bool, len(p.Outcomes))
	for i, o := range p.Outcomes {
		field := fmt.Sprintf("Outcomes[%d]", i)
		if err := o.Validate(); err != nil {
			var ve *ValidationError
			if errors.As(err, &ve) {
				return invalid(field+"."+ve.Field, ve.Reason)
			}
			return err
		}
		k := key{o.Topic, o.ID}
		if seen[k] {
			return invalid(field+".ID", "has more than one outcome in this call")
		}
		seen[k] = true
	}
	return nil
}

// Validate checks one outcome: a known Kind, an ID, an Attempt of at
// least 1, an Error for a retry or a dead letter, and no field its kind
// does not record (see Outcome).
func (o Outcome) Validate() error {
	switch {
	case !o.Kind.Valid():
		return invalid("Kind", fmt.Sprintf("%q is not an outcome kind", string(o.Kind)))
	case o.ID == "":
		return invalid("ID", "is required")
	case o.Attempt < 1:
		return invalid("Attempt", "must be at least 1")
	case o.BlockGroup && o.Kind != OutcomeDead:
		return invalid("BlockGroup", "applies to a dead letter only")
	}
	switch o.Kind {
	case OutcomeSent:
		if o.Error != nil {
			return invalid("Error", "must be nil for a sent outcome")
		}
		if !o.NextAttemptAt.IsZero() {
			return invalid("NextAttemptAt", "must be zero for a sent outcome")
		}
	case OutcomeRetry:
		if o.Error == nil {
			return invalid("Error", "is required for a retry")
		}
		if o.ProviderMessageID != "" {
			return invalid("ProviderMessageID", "is recorded only for a sent outcome")
		}
	case OutcomeDead:
		if o.Error == nil {
			return invalid("Error", "is required for a dead letter")
		}
		if !o.NextAttemptAt.IsZero() {
			return invalid("NextAttemptAt", "must be zero for a dead letter")
		}
		if o.ProviderMessageID != "" {
			return invalid("ProviderMessageID", "is recorded only for a sent outcome")
		}
	case OutcomeReleased:
		if o.Error != nil && o.NextAttemptAt.IsZero() {
			return invalid("Error", "is recorded only for a deferral (a release with NextAttemptAt)")
		}
		if o.ProviderMessageID != "" {
			return invalid("ProviderMessageID", "is recorded only for a sent outcome")
		}
		if o.ProviderResponse != nil {
			return invalid("ProviderResponse", "is not recorded for a release (it makes no attempt)")
		}
	}
	return nil
}

// Validate checks that ClaimedBefore is set and MaxRecoveries and
// MaxAttempts are not negative.
func (p MessageRecoverParams) Validate() error {
	if p.ClaimedBefore.IsZero() {
		return invalid("ClaimedBefore", "is required")
	}
	if p.MaxRecoveries < 0 {
		return invalid("MaxRecoveries", "must not be negative")
	}
	if p.MaxAttempts < 0 {
		return invalid("MaxAttempts", "must not be negative")
	}
	return p.DeadLetter.Validate("DeadLetter")
}

// Validate checks that Before is set, Limit is not negative and Statuses
// are finished statuses.
func (p MessagePruneParams) Validate() error {
	for _, st := range p.Statuses {
		if !st.Finished() {
			return invalid("Statuses", fmt.Sprintf("%q is not a finished status (SENT, DELIVERED, FAILED, CANCELLED)", string(st)))
		}
	}
	if len(p.Topic) > MaxKeyLength {
		return invalid("Topic", fmt.Sprintf("is %d bytes, the limit is %d", len(p.Topic), MaxKeyLength))
	}
	return validatePrune(p.Before.IsZero(), p.Limit)
}

// Validate checks that Before is set and Limit is not negative.
func (p InboxPruneParams) Validate() error { return validatePrune(p.Before.IsZero(), p.Limit) }

func validatePrune(noBefore bool, limit int) error {
	if noBefore {
		return invalid("Before", "is required")
	}
	if limit < 0 {
		return invalid("Limit", "must not be negative")
	}
	return nil
}

// Validate checks the filters: a known Status (or none), and Limit and
// AfterSeq not negative.
func (p MessageListParams) Validate() error {
	if p.Status != "" && !p.Status.Valid() {
		return invalid("Status", fmt.Sprintf("%q is not a status", string(p.Status)))
	}
	if p.Limit < 0 {
		return invalid("Limit", "must not be negative")
	}
	if p.AfterSeq < 0 {
		return invalid("AfterSeq", "must not be negative")
	}
	return nil
}

// Validate checks that ID is set.
func (p MessageGetParams) Validate() error { return requireID("ID", p.ID) }

// Validate checks that ID is set.
func (p MessageCancelParams) Validate() error { return requireID("ID", p.ID) }

// Validate checks that ID is set.
func (p MessageRequeueParams) Validate() error { return requireID("ID", p.ID) }

// Validate checks that MessageID is set.
func (p AttemptListParams) Validate() error { return requireID("MessageID", p.MessageID) }

// Validate checks that the receipt names a provider message ID and a
// receipt status.
func (p MessageApplyReceiptParams) Validate() error {
	if p.Receipt.ProviderMessageID == "" {
		return invalid("Receipt.ProviderMessageID", "is required")
	}
	if _, err := p.Receipt.Status.Event(); err != nil {
		return invalid("Receipt.Status", fmt.Sprintf("%q is not a delivery status (sent, delivered, read, failed)", string(p.Receipt.Status)))
	}
	return nil
}

func requireID(field, id string) error {
	if id == "" {
		return invalid(field, "is required")
	}
	return nil
}

// Prepare returns the messages of p ready to insert at the precision of a
// store: each validated and completed with now (and
// p.MaxPayloadBytes), times in UTC truncated to precision, a payload above
// ceiling (the store's PayloadLimiter ceiling; 0 means none) refused with a
// *PayloadTooLargeError (StoreCeiling set), and two messages with the same
// ID refused. Messages Outbox prepared for this call are not validated
// again. A store calls it once, at its entry, and inserts only what it
// returns. A caller's p.Messages is not changed (Outbox's own slice is
// finished in place).
func (p MessageEnqueueParams) Prepare(now time.Time, precision time.Duration, ceiling int) ([]Message, error) {
	// Outbox's messages were made for this call and prepared already; they
	// are finished in place. Any other slice is the caller's: copied, and
	// every message prepared.
	prepared := p.prepared != nil && len(p.Messages) > 0 && len(p.prepared.msgs) == len(p.Messages) &&
		&p.prepared.msgs[0] == &p.Messages[0]
	out := p.Messages
	if !prepared {
		out = make([]Message, len(p.Messages))
	}
	// IDs generated for this call are unique (a monotonic generator);
	// only the caller's are checked for repeats.
	var ids map[string]int
	limit := p.MaxPayloadBytes
	if limit <= 0 {
		limit = DefaultMaxPayloadBytes
	}
	for i := range p.Messages {
		m := p.Messages[i]
		if !prepared {
			if err := prepareMessage(&m, now, limit); err != nil {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
		}
		if ceiling > 0 && len(m.Payload) > ceiling {
			return nil, fmt.Errorf("message %d: %w", i, &PayloadTooLargeError{Size: len(m.Payload), Limit: ceiling, StoreCeiling: true})
		}
		m.CreatedAt = m.CreatedAt.UTC().Truncate(precision)
		m.UpdatedAt = m.UpdatedAt.UTC().Truncate(precision)
		m.NextAttemptAt = m.NextAttemptAt.UTC().Truncate(precision)
		if !m.IDGenerated() {
			if j, dup := ids[m.ID]; dup {
				return nil, fmt.Errorf("message %d: %w", i, invalid("ID", fmt.Sprintf("repeats the ID of message %d", j)))
			}
			if ids == nil {
				ids = make(map[string]int)
			}
			ids[m.ID] = i
		}
		out[i] = m
	}
	return out, nil
}
