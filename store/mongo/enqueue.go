package mongo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

// lenKey joins parts unambiguously (length-prefixed), without NUL bytes,
// which some MongoDB-compatible servers cannot store.
func lenKey(parts ...string) string {
	b := make([]byte, 0, 64)
	for _, p := range parts {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
}

// MessageEnqueue implements outbox.Enqueuer: it inserts p.Messages without
// a transaction of the caller's, then wakes the Wakeups listeners.
// Messages are validated first (a *outbox.ValidationError matching
// outbox.ErrInvalidInput, nothing inserted); a repeated (Tenant,
// IdempotencyKey) returns the stored message with Existed = true.
//
// The messages of an ordered group are inserted while holding the group's
// lock document, the one claims take, so a claim never sees a later message
// of a group before an earlier one. A batch is not atomic: a failure part
// way (the server going away) may leave the first messages inserted; a
// retry with the same idempotency keys returns them as existing.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	out, err := s.insert(ctx, msgs, false)
	if err != nil {
		return nil, err
	}
	s.Notify()
	return out, nil
}

// MessageEnqueueTx implements outbox.Enqueuer[context.Context]: tx is the
// context that carries the caller's session (the one
// Session.WithTransaction passes to its callback, or one made with
// mongo.NewSessionContext). When that session is in a transaction the
// messages are written in it and exist if and only if it commits; a
// repeated key is looked up first, so it never aborts the transaction.
// Without a transaction (a standalone server has none) the messages are
// written at once, as MessageEnqueue does: they are then not atomic with
// the caller's other writes.
//
// The sequence counter is one document, so transactions that enqueue are
// serialised on it (the server aborts and Session.WithTransaction retries
// the later one): a group's order is then the commit order. Wakeups sees
// the commit through a change stream where the server has them; otherwise
// call Notify after the commit, or use InTx.
func (s *Store) MessageEnqueueTx(ctx context.Context, tx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	sess := mongo.SessionFromContext(tx)
	if sess == nil {
		return nil, outbox.InvalidParam("tx", "carries no session: pass the context Session.WithTransaction gives its callback, or one from mongo.NewSessionContext")
	}
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	return s.insert(mongo.NewSessionContext(ctx, sess), msgs, sess.TransactionRunning())
}

// prepare returns copies of the messages ready to insert: prepared by
// outbox.Outbox already, or here for a direct caller, with times at the
// stored precision (the millisecond) and payloads within MaxPayloadBytes.
func (s *Store) prepare(p outbox.MessageEnqueueParams) ([]outbox.Message, error) {
	return p.Prepare(s.now(p.Now), time.Millisecond, MaxPayloadBytes)
}

// MaxPayloadBytes is the store's payload ceiling: a MongoDB document holds
// at most 16 MiB, and 64 KiB of it stay for the message's other fields
// (headers up to 16 KiB, five keys up to 255 bytes each).
const MaxPayloadBytes = 16<<20 - 64<<10

// MaxPayloadBytes implements outbox.PayloadLimiter (see the constant).
func (s *Store) MaxPayloadBytes() int { return MaxPayloadBytes }

type tenantKey struct{ tenant, key string }

// insert writes prepared messages with ctx (which may carry the caller's
// session). inTx tells that the session is in a transaction.
func (s *Store) insert(ctx context.Context, msgs []outbox.Message, inTx bool) ([]outbox.Enqueued, error) {
	mine := map[string]bool{} // IDs this call inserted (for a retry)
	for try := 0; ; try++ {
		out, err := s.insertOnce(ctx, msgs, inTx, mine)
		if err == nil {
			return out, nil
		}
		// A duplicate key outside a transaction is a race with another
		// writer (same key, or a sequence number taken twice): look again.
		if inTx || try >= 5 {
			return nil, fmt.Errorf("mongo: enqueue: %w", err)
		}
		if _, dup := dupIndexes(err); !dup && !mongo.IsDuplicateKeyError(err) {
			return nil, fmt.Errorf("mongo: enqueue: %w", err)
		}
	}
}

func (s *Store) insertOnce(ctx context.Context, msgs []outbox.Message, inTx bool, mine map[string]bool) ([]outbox.Enqueued, error) {
	or := make(bson.A, 0, len(msgs)+1)
	ids := make(bson.A, 0, len(msgs))
	for i := range msgs {
		or = append(or, bson.D{{Key: "tenant", Value: msgs[i].Tenant}, {Key: "key", Value: msgs[i].IdempotencyKey}})
		ids = append(ids, msgs[i].ID)
	}
	or = append(or, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	cur, err := s.msgs.Find(ctx, bson.D{{Key: "$or", Value: or}})
	if err != nil {
		return nil, err
	}
	var found []msgDoc
	if err := cur.All(ctx, &found); err != nil {
		return nil, err
	}
	byKey := map[tenantKey]*msgDoc{}
	byID := map[string]bool{}
	for i := range found {
		byKey[tenantKey{found[i].Tenant, found[i].Key}] = &found[i]
		byID[found[i].ID] = true
	}
	out := make([]outbox.Enqueued, len(msgs))
	var fresh []int              // indexes of the messages to insert
	batch := map[tenantKey]int{} // key -> index in msgs, for repeats within the call
	for i := range msgs {
		m := &msgs[i]
		k := tenantKey{m.Tenant, m.IdempotencyKey}
		if d, ok := byKey[k]; ok {
			out[i] = outbox.Enqueued{Message: d.message(), Existed: !mine[d.ID]}
			continue
		}
		if j, ok := batch[k]; ok {
			out[i] = outbox.Enqueued{Message: msgs[j], Existed: true} // completed below
			continue
		}
		if byID[m.ID] {
			return nil, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("ID", fmt.Sprintf("%q is already used by another message", m.ID)))
		}
		batch[k] = i
		fresh = append(fresh, i)
	}
	if len(fresh) > 0 {
		if !inTx {
			var keys []string
			seen := map[string]bool{}
			for _, i := range fresh {
				if gk := groupKey(&msgs[i]); gk != "" && !seen[gk] {
					seen[gk] = true
					keys = append(keys, lockKeyGroup(gk))
				}
			}
			if len(keys) > 0 {
				owner := token()
				if err := s.lockWait(ctx, keys, owner); err != nil {
					return nil, err
				}
				defer s.unlock(context.WithoutCancel(ctx), keys, owner)
			}
		}
		last, err := s.nextSeq(ctx, len(fresh))
		if err != nil {
			return nil, err
		}
		docs := make([]any, len(fresh))
		first := last - int64(len(fresh)) + 1
		for n, i := range fresh {
			d := newDoc(&msgs[i], first+int64(n))
			docs[n] = d
			msgs[i].Seq = d.Seq
		}
		_, err = s.msgs.InsertMany(ctx, docs, options.InsertMany().SetOrdered(true))
		if err != nil {
			// Ordered: the documents before the first error are in.
			if dups, ok := dupIndexes(err); ok {
				lowest := len(fresh)
				for ix := range dups {
					lowest = min(lowest, ix)
				}
				for _, i := range fresh[:lowest] {
					mine[msgs[i].ID] = true
				}
			}
			return nil, err
		}
		for _, i := range fresh {
			mine[msgs[i].ID] = true
			d := newDoc(&msgs[i], msgs[i].Seq)
			out[i] = outbox.Enqueued{Message: d.message()}
		}
	}
	for i := range out {
		if out[i].Existed && out[i].Message.Seq == 0 {
			j := batch[tenantKey{msgs[i].Tenant, msgs[i].IdempotencyKey}]
			out[i].Message = out[j].Message
		}
	}
	return out, nil
}

// nextSeq reserves n sequence numbers and returns the last one.
func (s *Store) nextSeq(ctx context.Context, n int) (int64, error) {
	var c struct {
		N int64 `bson:"n"`
	}
	err := s.counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "seq"}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(n)}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&c)
	if err != nil {
		return 0, fmt.Errorf("sequence: %w", err)
	}
	if c.N < int64(n) {
		return 0, errors.New("sequence: the counter went backwards")
	}
	return c.N, nil
}
