package postgres

import "sync"

// maxTIDs bounds the tuple IDs a store remembers (about 100 bytes each).
const maxTIDs = 1 << 16

// tidCache remembers the tuple ID (ctid) of the row version of each message
// this store leased (claim, lease renewal), so that the outcome statement
// finds the row directly instead of by a primary-key descent. An entry is
// only a hint: the outcome statement still checks the message ID and the
// lease (status, owner, attempt), and an outcome whose hint is missing or
// stale (the row moved since) is written by ID (see MessageFinish).
type tidCache struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *tidCache) put(id, tid string) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxTIDs {
		// Entries of leases never finished here (a claim abandoned to
		// lease recovery) would otherwise pile up: start over.
		c.m = make(map[string]string)
	}
	c.m[id] = tid
	c.mu.Unlock()
}

// take removes and returns the tuple ID remembered for id.
func (c *tidCache) take(id string) (string, bool) {
	c.mu.Lock()
	tid, ok := c.m[id]
	if ok {
		delete(c.m, id)
	}
	c.mu.Unlock()
	return tid, ok
}
