package mongo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// Item is one document to insert into a seed collection.
type Item struct {
	// Topic chooses the collection: flowcatalyst.TopicEvent or
	// flowcatalyst.TopicDispatchJob. Required.
	Topic string
	// Group is the messageGroup (FIFO key); "" writes null (the group
	// "default", or unordered with Options.UnorderedNullGroup).
	Group string
	// Payload is the item sent to FlowCatalyst, a JSON document, stored as
	// a string. Required.
	Payload json.RawMessage
	// ID is the _id; defaults to a new TSID; at most 13 characters.
	ID string
	// CreatedAt orders the group; defaults to now.
	CreatedAt time.Time
	// DueAt, when set, delays the first attempt until then: it is written
	// to processedAt, which holds a PENDING document's due time (see the
	// package seedstore). Zero: due at once (processedAt null).
	DueAt time.Time
}

// MessageEnqueue implements outbox.Enqueuer: it writes the messages as
// PENDING documents, in the session ctx carries if any (see Insert); see
// MessageEnqueueTx for the mapping.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	items, err := s.core.ItemsOf(p, false)
	if err != nil {
		return nil, err
	}
	rows, err := s.core.PrepareItems(items)
	if err != nil {
		return nil, err
	}
	if _, err := s.insert(ctx, rows); err != nil {
		return nil, err
	}
	return s.core.Enqueued(items, time.Millisecond), nil
}

// MessageEnqueueTx implements outbox.Enqueuer[context.Context], as
// store/mongo does: tx is the context that carries the caller's session
// (the one Session.WithTransaction passes to its callback). When that
// session is in a transaction the documents are written in it and exist if
// and only if it commits; without one they are written at once.
//
// The seed's document has fewer fields than an outbox.Message: the Topic
// picks the collection (flowcatalyst.TopicEvent or
// flowcatalyst.TopicDispatchJob), Group is messageGroup ("" is null),
// Payload the payload, CreatedAt the createdAt, a future NextAttemptAt the
// processedAt of the PENDING document (its due time). An ID of at most 13
// characters is kept; a longer one (the ULID outbox.Outbox assigns) is
// replaced by a new TSID, the id the seed's readers expect. A Tenant,
// Headers or an IdempotencyKey other than the ID have no field and are
// refused with an error matching outbox.ErrInvalidInput.
func (s *Store) MessageEnqueueTx(_ context.Context, tx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	return s.MessageEnqueue(tx, p)
}

// Insert writes items as PENDING documents, in the session ctx carries if
// any (inside Session.WithTransaction they commit with the caller's writes;
// without a transaction each document is written at once). It returns the
// ids in order. Items are validated before anything is written (an invalid
// item returns an error matching outbox.ErrInvalidInput). Applications in
// other languages write the same documents with insertOne.
func (s *Store) Insert(ctx context.Context, items ...Item) ([]string, error) {
	in := make([]seedcore.Item, len(items))
	for i, it := range items {
		in[i] = seedcore.Item(it)
	}
	rows, err := s.core.PrepareItems(in)
	if err != nil {
		return nil, err
	}
	return s.insert(ctx, rows)
}

// insert writes prepared rows.
func (s *Store) insert(ctx context.Context, rows []seedcore.Item) ([]string, error) {
	// One insertMany per collection and chunk, in order: a failure (say a
	// duplicate _id) stops at that document.
	ids := make([]string, len(rows))
	docs := map[*table][]any{}
	var order []*table
	for i, it := range rows {
		t := s.tableOf(it.Topic)
		var group any
		if it.Group != "" {
			group = it.Group
		}
		var due any
		if !it.DueAt.IsZero() {
			due = it.DueAt.UTC().Truncate(time.Millisecond)
		}
		if docs[t] == nil {
			order = append(order, t)
		}
		docs[t] = append(docs[t], bson.D{
			{Key: "_id", Value: it.ID}, {Key: "type", Value: it.Topic}, {Key: "messageGroup", Value: group},
			{Key: "payload", Value: string(it.Payload)}, {Key: "status", Value: StatusPending}, {Key: "retryCount", Value: 0},
			{Key: "createdAt", Value: it.CreatedAt.UTC().Truncate(time.Millisecond)}, {Key: "processedAt", Value: due},
			{Key: "errorMessage", Value: nil},
		})
		ids[i] = it.ID
	}
	for _, t := range order {
		d := docs[t]
		for start := 0; start < len(d); start += writeChunk {
			if _, err := t.coll.InsertMany(ctx, d[start:min(start+writeChunk, len(d))]); err != nil {
				return nil, fmt.Errorf("seedstore: insert into %s: %w", t.raw, err)
			}
		}
	}
	return ids, nil
}
