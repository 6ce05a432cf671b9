package outbox

import (
	"context"
	"fmt"
	"time"
)

// LeaseExtender is an optional Store capability: extending the leases a
// processor still holds. A processor on a store that has it renews the
// lease of every message it holds (waiting in its buffer, being published,
// or with its outcome not yet written) well before ProcessingTimeout, so a
// slow publish or a stalled store never lets lease recovery hand a message
// to another processor while it is being published. On a store without it,
// ProcessingTimeout must exceed the longest a message can be held; the
// processor says so in a warning when it starts.
type LeaseExtender interface {
	// MessageExtendLease sets ClaimedAt to p.Now for every lease in
	// p.Leases that p.Owner still holds (status PROCESSING, ClaimedBy =
	// Owner, Attempts = the lease's Attempt, ClaimToken = the lease's
	// ClaimToken), and returns the IDs of the others in LeaseLost. It
	// changes nothing else.
	MessageExtendLease(ctx context.Context, p MessageExtendLeaseParams) (ExtendLeaseResult, error)
}

// Lease names one claimed message by its Topic and ID, and the claim by its
// Attempt and ClaimToken (the message's when it was claimed): the same
// fence as an outcome of MessageFinish. The token keeps a processor from
// extending a later claim of the message than its own.
type Lease struct {
	Topic      string
	ID         string
	Attempt    int
	ClaimToken string
}

// MessageExtendLeaseParams lists the leases of one owner to extend.
type MessageExtendLeaseParams struct {
	Owner  string
	Now    time.Time
	Leases []Lease
}

// ExtendLeaseResult lists the leases that were not extended because their
// owner no longer holds them (the outcome was written, or the lease expired
// and was recovered, maybe claimed by another processor).
type ExtendLeaseResult struct {
	LeaseLost []string
}

// MaxExtendLeases is the most leases one MessageExtendLease call takes.
const MaxExtendLeases = MaxClaimLimit

// Validate checks the call: an Owner, a Now, at most MaxExtendLeases
// leases, each with an ID and an Attempt of at least 1, and no ID twice.
func (p MessageExtendLeaseParams) Validate() error {
	if p.Owner == "" {
		return invalid("Owner", "is required")
	}
	if p.Now.IsZero() {
		return invalid("Now", "is required")
	}
	if len(p.Leases) > MaxExtendLeases {
		return invalid("Leases", fmt.Sprintf("has %d leases, at most %d", len(p.Leases), MaxExtendLeases))
	}
	seen := make(map[string]bool, len(p.Leases))
	for i, l := range p.Leases {
		field := fmt.Sprintf("Leases[%d]", i)
		switch {
		case l.ID == "":
			return invalid(field+".ID", "is required")
		case l.Attempt < 1:
			return invalid(field+".Attempt", "must be at least 1")
		case seen[l.Topic+"\x00"+l.ID]:
			return invalid(field+".ID", "is named twice")
		}
		seen[l.Topic+"\x00"+l.ID] = true
	}
	return nil
}
