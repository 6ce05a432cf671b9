package seedstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// Execer runs a statement: *sql.Tx (the usual case: the application's own
// transaction), *sql.DB or *sql.Conn.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Item is one row to insert into a seed table.
type Item struct {
	// Topic chooses the table: flowcatalyst.TopicEvent or
	// flowcatalyst.TopicDispatchJob. Required.
	Topic string
	// Group is the message_group (FIFO key); "" writes NULL (the group
	// "default", or unordered with Options.UnorderedNullGroup).
	Group string
	// Payload is the item sent to FlowCatalyst, a JSON document. Required.
	Payload json.RawMessage
	// ID defaults to a new TSID; at most 13 characters.
	ID string
	// CreatedAt orders the group; defaults to now.
	CreatedAt time.Time
	// DueAt, when set, delays the first attempt until then: it is written
	// to processed_at, which holds a PENDING row's due time (see the
	// package doc). Zero: due at once (processed_at NULL).
	DueAt time.Time
}

// Insert writes items as PENDING rows through ex, typically the
// application's transaction, so they are sent if and only if it commits.
// It returns the ids in order. Items are validated before any statement
// runs (an invalid item returns an error matching outbox.ErrInvalidInput and
// leaves the transaction usable). Applications in other languages write the
// same rows with plain SQL.
func (s *Store) Insert(ctx context.Context, ex Execer, items ...Item) ([]string, error) {
	if s.mg != nil {
		return nil, errors.New("seedstore: Insert needs a SQL Store; use InsertMongo on MongoDB")
	}
	rows, err := s.prepareItems(items)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rows))
	for i, it := range rows {
		t := s.tableOf(it.Topic)
		var group any
		if it.Group != "" {
			group = it.Group
		}
		var due any
		if !it.DueAt.IsZero() {
			due = at(it.DueAt)
		}
		if _, err := ex.ExecContext(ctx, t.sql.insert, it.ID, it.Topic, group, string(it.Payload), at(it.CreatedAt), due); err != nil {
			return nil, fmt.Errorf("seedstore: insert into %s: %w", t.raw, err)
		}
		ids[i] = it.ID
	}
	return ids, nil
}

// prepareItems validates items and fills in their defaults.
func (s *Store) prepareItems(items []Item) ([]Item, error) {
	now := time.Now()
	rows := make([]Item, len(items))
	for i, it := range items {
		if s.tableOf(it.Topic) == nil {
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
