package postgres

import (
	"encoding/json"
	"sync"

	"github.com/outboxkit/outboxkit/outbox"
)

// floorGeneration bounds the groups whose floor a store remembers: two
// generations of floorGeneration each (about 40 bytes a group, sent with
// every claim).
const floorGeneration = 1024

// groupFloors remembers, per group (tenant, topic, group), a floor: a
// sequence number below which no message of the group is waiting (PENDING,
// or a dead letter that blocks the group) or leased. A claim starts its
// lookups of a group's first waiting and first leased message at the
// group's floor instead of at the group's first index entry.
//
// Why: each message leaves index entries in the group and lease indexes
// (its PENDING and its PROCESSING row versions) that stay until a vacuum
// removes them, and nothing can remove them while a transaction holds the
// cleanup horizon (a long report, a forgotten BEGIN, pg_dump, a lagging
// replication slot). A lookup from a group's first entry then visits every
// message the group has had since the horizon was taken, each with a visit
// to its dead row version: the claim's work per message grows with the
// length of the hold. From the floor, it visits at most the group's last
// run.
//
// Where floors come from: the head of each run this store claimed. A
// message is claimed as its group's head only when no earlier message of
// its group is waiting or leased, so every earlier message is finished
// (SENT, DELIVERED, FAILED without blocking, CANCELLED) and stays so: a
// finished message becomes waiting again only by a requeue, and a requeue
// of a dead letter that did not block its group gives it a new sequence
// number (the end of its group, above every floor); one that blocks its
// group is above every floor already (nothing after it was claimed). A
// floor is a hint all the same: a waiting message below its group's floor
// makes the claim ignore that floor (see claimFloor in sql.go). A store
// knows the floors of the groups it claimed; other processors' progress
// makes its lookups longer, never wrong.
type groupFloors struct {
	mu       sync.Mutex
	cur, old map[string]int64
	server   string // the server the floors were learned on (see sawServer)
}

// onServer records the server a claim ran on, and forgets every floor when
// it is not the one they were learned on (it reports whether so).
func (f *groupFloors) onServer(server string) (changed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if server == f.server {
		return false
	}
	f.server, f.cur, f.old = server, nil, nil
	return true
}

// floorKey is the key of a group in the floors JSON object, as the claim's
// SQL builds it: tenant, topic and group joined by the unit separator.
func floorKey(tenant, topic, grp string) string {
	return tenant + "\x1f" + topic + "\x1f" + grp
}

// claimed records the heads of the runs in msgs, a claim's messages in
// sequence order: the first message of each group among them. (Only the
// head: the rest of a run may come back to PENDING, behind a retry of an
// earlier message of the run.)
func (f *groupFloors) claimed(msgs []outbox.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := make(map[string]struct{}, len(msgs))
	for _, m := range msgs {
		if m.Group == "" {
			continue
		}
		k := floorKey(m.Tenant, m.Topic, m.Group)
		if _, ok := seen[k]; ok {
			continue // not the head of its run
		}
		seen[k] = struct{}{}
		if v, ok := f.cur[k]; ok && v >= m.Seq {
			continue
		}
		if old, ok := f.old[k]; ok && old >= m.Seq {
			continue
		}
		if f.cur == nil || len(f.cur) >= floorGeneration {
			f.old, f.cur = f.cur, make(map[string]int64, floorGeneration)
		}
		f.cur[k] = m.Seq
	}
}

// json returns the floors as a JSON object (key to sequence number, and
// "" to the server they hold on), the claim's parameter; "{}" when there
// are none.
func (f *groupFloors) json() string {
	f.mu.Lock()
	all := make(map[string]any, len(f.cur)+len(f.old)+1)
	if f.server != "" {
		all[""] = f.server // the claim applies the floors on this server only
	}
	for k, v := range f.old {
		all[k] = v
	}
	for k, v := range f.cur {
		if o, ok := all[k].(int64); !ok || v > o {
			all[k] = v
		}
	}
	f.mu.Unlock()
	b, err := json.Marshal(all)
	if err != nil { // a map of strings to numbers always encodes
		return "{}"
	}
	return string(b)
}
