package postgres

import (
	"sync"

	"github.com/outboxkit/outboxkit/outbox"
)

// maxTIDs bounds the tuple IDs a store remembers (about 100 bytes each).
const maxTIDs = 1 << 16

// tidCache remembers the tuple ID (ctid) of the row version of each message
// this store leased (claim, lease renewal), so that the outcome statement
// finds the row directly instead of by a primary-key descent. An entry is
// only a hint: the outcome statement still checks the message ID and the
// lease (status, owner, attempt, claim token), and an outcome whose hint is
// missing or stale (the row moved since) is written by ID (see
// MessageFinish).
type tidCache struct {
	mu sync.Mutex
	m  map[string]string
	// written holds outcomes a MessageFinish wrote (committed) before a
	// later statement of the same call failed: the caller retries the
	// whole batch, and those are then reported applied, not as lost
	// leases (their rows are no longer PROCESSING). An entry lives until
	// that retry or until this store leases the message again.
	written map[string]writtenOutcome
}

// writtenOutcome identifies an outcome: its lease (owner, attempt and claim
// token) and its kind.
type writtenOutcome struct {
	owner   string
	attempt int
	token   string
	kind    outbox.OutcomeKind
}

func (c *tidCache) put(id, tid string) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxTIDs {
		// Entries of leases never finished here (a claim abandoned to
		// lease recovery) would otherwise pile up: start over.
		c.m = make(map[string]string)
	}
	c.m[id] = tid
	delete(c.written, id) // a new lease: no earlier outcome applies to it
	c.mu.Unlock()
}

// wrote remembers that o, of owner's lease, was written.
func (c *tidCache) wrote(owner string, o outbox.Outcome) {
	c.mu.Lock()
	if c.written == nil || len(c.written) >= maxTIDs {
		c.written = make(map[string]writtenOutcome)
	}
	c.written[o.ID] = writtenOutcome{owner, o.Attempt, o.ClaimToken, o.Kind}
	c.mu.Unlock()
}

// split sorts owner's outcomes under one lock: those an earlier call wrote
// before it failed go into applied (and are forgotten), those with a tuple
// ID remembered go to hinted with their tuple IDs (taken), and the rest to
// byID.
func (c *tidCache) split(owner string, outcomes []outbox.Outcome, applied map[string]struct{}) (hinted []outbox.Outcome, tids []string, byID []outbox.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range outcomes {
		if w, ok := c.written[o.ID]; ok && w == (writtenOutcome{owner, o.Attempt, o.ClaimToken, o.Kind}) {
			delete(c.written, o.ID) // by the failed call this one retries
			applied[o.ID] = struct{}{}
			continue
		}
		if tid, ok := c.m[o.ID]; ok {
			delete(c.m, o.ID)
			hinted, tids = append(hinted, o), append(tids, tid)
		} else {
			byID = append(byID, o)
		}
	}
	return hinted, tids, byID
}
