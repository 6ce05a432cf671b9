package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedsql"
	"github.com/outboxkit/outboxkit/outbox"
)

// Execer runs a statement: *sql.Tx (the usual case: the application's own
// transaction), *sql.DB or *sql.Conn.
type Execer = seedsql.Execer

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
	in := make([]seedcore.Item, len(items))
	for i, it := range items {
		in[i] = seedcore.Item(it)
	}
	return s.shared.Insert(ctx, ex, in)
}

// MessageEnqueue implements outbox.Enqueuer: it writes the messages as
// PENDING rows in a transaction of its own; see MessageEnqueueTx for the
// mapping.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return s.shared.Enqueue(ctx, p)
}

// MessageEnqueueTx implements outbox.Enqueuer[*sql.Tx]: the rows are
// written in tx and exist if and only if it commits, so
// outbox.New[*sql.Tx](store, ...) enqueues into seed 004's tables.
//
// The seed's row has fewer fields than an outbox.Message: the Topic picks
// the table (flowcatalyst.TopicEvent or flowcatalyst.TopicDispatchJob),
// Group is message_group ("" is NULL), Payload the payload, CreatedAt the
// created_at (each message a microsecond after the one before at least, so
// that a group keeps its order), a future NextAttemptAt the processed_at of
// the PENDING row (its due time). An ID of at most 13 characters is kept; a
// longer one (the ULID outbox.Outbox assigns) is replaced by a new TSID, the
// id the seed's readers expect. A Tenant, Headers or an IdempotencyKey
// other than the ID have no column and are refused with an error matching
// outbox.ErrInvalidInput (MaxAttempts is the processor's, not the row's).
func (s *Store) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	return s.shared.EnqueueTx(ctx, tx, p)
}
