package seedcore

import (
	"errors"
	"fmt"
	"sort"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// List is a MessageList as the stores run it on each table.
type List struct {
	Limit  int    // the page size; each table is asked for Limit + 1
	Status string // the seed status, or "" for any
	After  string // the id to start after, or "" from the start
	Topic  string // "" for both tables
	Group  string // "" for any
}

// BeginList validates p and returns the query per table; ok is false when
// nothing can match (a tenant, dead letters that block their group, a
// status the seed has not).
func BeginList(p outbox.MessageListParams) (q List, ok bool, err error) {
	if err := p.Validate(); err != nil {
		return List{}, false, err
	}
	if p.Tenant != "" || p.BlocksGroup {
		return List{}, false, nil // no tenants, no blocking dead letters
	}
	q = List{Limit: p.Limit, Topic: p.Topic, Group: p.Group}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	if q.Limit > 1000 {
		return List{}, false, outbox.InvalidParam("Limit", "must be at most 1000")
	}
	if p.Status != "" {
		if q.Status, ok = SeedStatus(p.Status); !ok {
			return List{}, false, nil
		}
	}
	if p.AfterSeq > 0 {
		q.After = flowcatalyst.TSID(p.AfterSeq).String()
	}
	return q, true, nil
}

// Page orders the messages of both tables by id and cuts them to q's
// page.
func (q List) Page(all []outbox.Message) outbox.MessagePage {
	sort.SliceStable(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	page := outbox.MessagePage{Messages: all}
	if len(all) > q.Limit {
		page.Messages = all[:q.Limit]
		page.NextAfterSeq = page.Messages[q.Limit-1].Seq
	}
	return page
}

// NewCounts returns every outbox status counted 0.
func NewCounts() map[outbox.Status]int64 {
	out := map[outbox.Status]int64{}
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	return out
}

// PruneLimit validates p and returns the most rows to delete per table.
func PruneLimit(p outbox.MessagePruneParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	if len(p.Statuses) > 0 || p.Topic != "" || p.DryRun {
		return 0, outbox.InvalidParam("MessagePruneParams", "the seed tables prune by age only (no Statuses, Topic or DryRun)")
	}
	if p.Limit <= 0 {
		return 1000, nil
	}
	return p.Limit, nil
}

// RequeueRefused is MessageRequeue's error for a row that exists but is
// not FAILED.
func RequeueRefused(m outbox.Message) error {
	return fmt.Errorf("seedstore: requeue %s: %w", m.Status, outbox.ErrInvalidTransition)
}

// ErrCancel is MessageCancel's error: the seed has no CANCELLED status,
// and writing one would break the seed's readers.
var ErrCancel = fmt.Errorf("seedstore: cancel: the seed tables have no CANCELLED status: %w", errors.ErrUnsupported)
