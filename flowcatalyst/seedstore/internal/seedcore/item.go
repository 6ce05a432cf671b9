package seedcore

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// Item is one row to insert into a seed table; each store's Item
// documents its fields.
type Item struct {
	Topic     string
	Group     string
	Payload   json.RawMessage
	ID        string
	CreatedAt time.Time
	DueAt     time.Time
}

// PrepareItems validates items and fills in their defaults (a new TSID,
// created now): an invalid item returns an error matching
// outbox.ErrInvalidInput before anything is written.
func (c *Core) PrepareItems(items []Item) ([]Item, error) {
	now := time.Now()
	rows := make([]Item, len(items))
	for i, it := range items {
		if !c.HasTopic(it.Topic) {
			return nil, outbox.InvalidParam(fmt.Sprintf("items[%d].Topic", i), fmt.Sprintf("must be %s or %s", flowcatalyst.TopicEvent, flowcatalyst.TopicDispatchJob))
		}
		if len(it.Payload) == 0 || !json.Valid(it.Payload) {
			return nil, outbox.InvalidParam(fmt.Sprintf("items[%d].Payload", i), "must be a JSON document")
		}
		if len(it.Group) > 255 || !utf8.ValidString(it.Group) {
			return nil, outbox.InvalidParam(fmt.Sprintf("items[%d].Group", i), "must be valid UTF-8 of at most 255 bytes")
		}
		if it.ID == "" {
			it.ID = flowcatalyst.NewTSID().String()
		}
		if len(it.ID) > flowcatalyst.TSIDLen || !utf8.ValidString(it.ID) {
			return nil, outbox.InvalidParam(fmt.Sprintf("items[%d].ID", i), "must be at most 13 characters")
		}
		if it.CreatedAt.IsZero() {
			it.CreatedAt = now
		}
		rows[i] = it
	}
	return rows, nil
}

// ItemsOf maps p's messages to rows: the Topic picks the table, Group is
// message_group ("" is NULL), Payload the payload, CreatedAt the
// created_at, a future NextAttemptAt the due time of the PENDING row. An
// ID of at most 13 characters is kept; a longer one (the ULID outbox.Outbox
// assigns) is replaced by a new TSID, the id the seed's readers expect. A
// Tenant, Headers or an IdempotencyKey other than the ID have no column
// and are refused with an error matching outbox.ErrInvalidInput.
//
// strictOrder makes each message's created_at later than the one before
// (by a microsecond if need be): rows of one group with equal created_at
// have no order on PostgreSQL, where the seed orders by created_at alone.
func (c *Core) ItemsOf(p outbox.MessageEnqueueParams, strictOrder bool) ([]Item, error) {
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	msgs, err := p.Prepare(now, time.Microsecond, 0)
	if err != nil {
		return nil, err
	}
	out := make([]Item, len(msgs))
	for i := range msgs {
		m := msgs[i]
		field := func(f string) string { return fmt.Sprintf("Messages[%d].%s", i, f) }
		switch {
		case m.Tenant != "":
			return nil, outbox.InvalidParam(field("Tenant"), "seed 004's tables have no tenant")
		case len(m.Headers) > 0:
			return nil, outbox.InvalidParam(field("Headers"), "seed 004's tables have no headers")
		case m.IdempotencyKey != "" && m.IdempotencyKey != m.ID:
			return nil, outbox.InvalidParam(field("IdempotencyKey"), "seed 004's tables have no idempotency key")
		}
		id := m.ID
		if len(id) > flowcatalyst.TSIDLen {
			id = flowcatalyst.NewTSID().String()
		}
		it := Item{Topic: m.Topic, Group: m.Group, Payload: m.Payload, ID: id, CreatedAt: m.CreatedAt}
		if m.NextAttemptAt.After(now) {
			it.DueAt = m.NextAttemptAt
		}
		c.mu.Lock()
		if at := At(it.CreatedAt); strictOrder && !at.After(c.lastCreated) {
			it.CreatedAt = c.lastCreated.Add(time.Microsecond)
		}
		c.lastCreated = At(it.CreatedAt)
		c.mu.Unlock()
		out[i] = it
	}
	return out, nil
}

// Enqueued returns the messages items became once written, with times
// truncated to precision, as the database stores them (microseconds on
// PostgreSQL, milliseconds on MongoDB, whole seconds on MySQL).
func (c *Core) Enqueued(items []Item, precision time.Duration) []outbox.Enqueued {
	stored := func(t time.Time) time.Time { return At(t).Truncate(precision) }
	out := make([]outbox.Enqueued, len(items))
	for i, it := range items {
		r := Row{ID: it.ID, Type: it.Topic, Payload: string(it.Payload), Status: StatusPending, CreatedAt: stored(it.CreatedAt)}
		if it.Group != "" {
			r.Group.String, r.Group.Valid = it.Group, true
		}
		if !it.DueAt.IsZero() {
			r.ProcessedAt.Time, r.ProcessedAt.Valid = stored(it.DueAt), true
		}
		out[i] = outbox.Enqueued{Message: c.Message(&r, it.Topic)}
	}
	return out
}
