package seedcore

import (
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

type leaseKey struct{ topic, id string }

// lease is what a Store remembers of a row it claimed: outcomes are fenced
// by the claim time (processed_at) and by the claim token.
type lease struct {
	claimedAt time.Time
	attempt   int
	// owner and token are the claim's owner and claim token, which the
	// tables have no column for: an outcome must carry the token (a row
	// released and claimed again within the same second has the same
	// processed_at on MySQL, and the same attempt).
	owner, token string
	// gen tells this claim of the row from a later one: a finish forgets
	// only the leases it used, not the new lease of a row claimed again
	// between its commit and its forget (a retry due at once).
	gen uint64
}

// heldLease is a lease a finish used, for forget.
type heldLease struct {
	key leaseKey
	gen uint64
}

// Remember records the leases of rows claimed from topic's table: out[i]
// was claimed at claimed[i], as the database wrote processed_at, by
// out[i].ClaimedBy. Each gets a new claim token (set on out[i]), which its
// outcome must carry.
func (c *Core) Remember(topic string, out []outbox.Message, claimed []time.Time) {
	c.mu.Lock()
	for i := range out {
		m := &out[i]
		c.leaseGen++
		m.ClaimToken = outbox.NewClaimToken()
		c.leases[leaseKey{topic, m.ID}] = lease{claimedAt: claimed[i], attempt: m.Attempts, gen: c.leaseGen,
			owner: m.ClaimedBy, token: m.ClaimToken}
	}
	c.mu.Unlock()
}

// leaseOf returns the topic of the table and the lease this Store holds on
// (topic, id). An outcome without a topic (a caller other than outbox's
// processor) matches only when the id is leased in exactly one table: ids
// are unique per table, not across the two, so an id alone never picks a
// table by guess.
func (c *Core) leaseOf(topic, id string) (string, lease, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if topic != "" {
		if !c.HasTopic(topic) {
			return "", lease{}, false
		}
		l, ok := c.leases[leaseKey{topic, id}]
		return topic, l, ok
	}
	found := ""
	var fl lease
	for _, t := range c.tables {
		if l, ok := c.leases[leaseKey{t.Topic, id}]; ok {
			if found != "" {
				return "", lease{}, false
			}
			found, fl = t.Topic, l
		}
	}
	return found, fl, found != ""
}

// forget drops the leases a committed finish used, and only those: once
// its transaction has committed, a row it made due again (a retry, a
// release) may already be claimed again, by this Store, under a new lease
// that must stay.
func (c *Core) forget(keys []heldLease) {
	if c.BeforeForget != nil {
		c.BeforeForget()
	}
	c.mu.Lock()
	for _, k := range keys {
		if l, ok := c.leases[k.key]; ok && l.gen == k.gen {
			delete(c.leases, k.key)
		}
	}
	c.mu.Unlock()
}

// forgetBefore drops the leases taken before before: they expired, and
// their outcomes will be refused anyway.
func (c *Core) forgetBefore(before time.Time) {
	c.mu.Lock()
	for k, l := range c.leases {
		if l.claimedAt.Before(before) {
			delete(c.leases, k)
		}
	}
	c.mu.Unlock()
}
