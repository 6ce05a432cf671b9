package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// MessageFinish records outcomes, fenced by the claim: an outcome applies
// only while its document is PROCESSING with the processedAt this Store's
// claim wrote (and the same attempt). Outcomes for documents this Store did
// not claim, or whose lease was lost, are returned in LeaseLost. Outcomes
// are matched to leases by (topic, id): an event and a dispatch job may
// share an id. Without transactions the outcomes are written one
// updateMany after the other (see finish), each applying on its own.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	f, err := s.core.BeginFinish(p)
	if err != nil {
		return outbox.FinishResult{}, err
	}
	if len(f.Tables) == 0 {
		return f.Result, nil
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return outbox.FinishResult{}, err
	}
	lost, err := s.finish(ctx, f.Tables, now)
	if err != nil {
		return outbox.FinishResult{}, err
	}
	return s.core.End(f, lost), nil
}

// MessageRecover puts back to PENDING every PROCESSING document claimed
// longer than p.Now - p.ClaimedBefore ago by the server's clock (its
// processor died or stalled). As in the seed, a recovered document keeps
// its retryCount ("no lost messages, just delayed"); with
// Options.RecoveryCountsAttempt the lost attempt is counted and a document
// that used its last attempt (p.MaxAttempts, which must be positive) is
// marked FAILED.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	timeout, before, err := seedcore.BeginRecover(p)
	if err != nil {
		return outbox.RecoverResult{}, err
	}
	var res outbox.RecoverResult
	for _, t := range s.tables {
		rec, dead, err := s.recover(ctx, t, time.Duration(timeout)*time.Microsecond, p.MaxAttempts)
		res.Recovered += rec
		res.DeadLettered += dead
		if err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
		}
	}
	s.core.EndRecover(before)
	return res, nil
}

// finish applies outcomes: per collection, one updateMany per
// (claim time, values) and writeChunk documents, fenced by the lease (the
// document is PROCESSING with the processedAt this Store's claim wrote).
// It returns the ids of the outcomes that did not apply.
func (s *Store) finish(ctx context.Context, work map[string]*seedcore.Work, now time.Time) ([]string, error) {
	var lost []string
	for _, t := range s.tables {
		w := work[t.topic]
		if w == nil {
			continue
		}
		if err := s.finishTable(ctx, t, w, now, &lost); err != nil {
			return nil, fmt.Errorf("seedstore: finish %s: %w", t.raw, err)
		}
	}
	return lost, nil
}

// mongoState is what an outcome writes: the status and processedAt (nil:
// null) a document holds once it applied.
type mongoState struct {
	status string
	at     any
}

func (s *Store) finishTable(ctx context.Context, t *table, w *seedcore.Work, now time.Time, lost *[]string) error {
	type key struct {
		claimed time.Time
		set     string
	}
	type change struct {
		claimed time.Time
		ids     []string
		set     bson.D
	}
	var order []key
	changes := map[key]*change{}
	want := map[string]mongoState{}
	add := func(b *seedcore.Batch, i int, status string, at any, more ...bson.E) {
		set := append(bson.D{{Key: "status", Value: status}, {Key: "processedAt", Value: at}}, more...)
		k := key{claimed: b.Claimed[i].UTC().Truncate(time.Millisecond), set: fmt.Sprint(set)}
		if changes[k] == nil {
			order = append(order, k)
			changes[k] = &change{claimed: k.claimed, set: set}
		}
		changes[k].ids = append(changes[k].ids, b.IDs[i])
		want[b.IDs[i]] = mongoState{status: status, at: at}
	}
	after := func(us int64) time.Time {
		return now.Add(time.Duration(us) * time.Microsecond).Truncate(time.Millisecond)
	}
	for i := range w.Sent.IDs {
		add(&w.Sent, i, StatusCompleted, now, bson.E{Key: "errorMessage", Value: nil})
	}
	for i := range w.Retry.IDs {
		add(&w.Retry, i, StatusPending, after(w.Retry.Next[i]),
			bson.E{Key: "retryCount", Value: w.Retry.Retry[i]}, bson.E{Key: "errorMessage", Value: w.Retry.Msgs[i]})
	}
	for i := range w.Dead.IDs {
		add(&w.Dead, i, StatusFailed, now, bson.E{Key: "errorMessage", Value: w.Dead.Msgs[i]})
	}
	for i := range w.Released.IDs {
		var next any // nil: due at once
		if d := w.Released.DeferTo[i]; d != nil {
			next = after(*d)
		}
		add(&w.Released, i, StatusPending, next)
	}
	// One updateMany per change and writeChunk ids, one after the other:
	// FerretDB v1 holds a PostgreSQL connection per statement of a bulk
	// write until the command ends, and concurrent bulk writes deadlock its
	// pool.
	for _, k := range order {
		c := changes[k]
		for start := 0; start < len(c.ids); start += writeChunk {
			ids := c.ids[start:min(start+writeChunk, len(c.ids))]
			res, err := t.coll.UpdateMany(ctx, append(bson.D{{Key: "status", Value: StatusProcessing},
				{Key: "processedAt", Value: c.claimed}}, idFilter(ids)...), bson.D{{Key: "$set", Value: c.set}})
			if err != nil {
				return err
			}
			if int(res.MatchedCount) != len(ids) {
				// Some leases were lost (recovered, maybe claimed again):
				// the documents that do not hold what their outcome wrote
				// (its status and processedAt, to the millisecond of this
				// finish's server time) are the ones it did not apply to.
				applied, err := s.holding(ctx, t, ids, want)
				if err != nil {
					return err
				}
				for _, id := range ids {
					if !applied[id] {
						*lost = append(*lost, id)
					}
				}
			}
		}
	}
	return nil
}

// holding returns which of ids hold the state want names for them.
func (s *Store) holding(ctx context.Context, t *table, ids []string, want map[string]mongoState) (map[string]bool, error) {
	rows, err := findRows(ctx, t.coll, idFilter(ids),
		options.Find().SetProjection(bson.D{{Key: "status", Value: 1}, {Key: "processedAt", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range rows {
		w, ok := want[r.ID]
		if !ok || r.Status != w.status {
			continue
		}
		switch at := w.at.(type) {
		case time.Time:
			out[r.ID] = r.ProcessedAt.Valid && r.ProcessedAt.Time.Equal(at)
		default: // null
			out[r.ID] = !r.ProcessedAt.Valid
		}
	}
	return out, nil
}

// recover puts t's stuck PROCESSING documents back to PENDING (or,
// with Options.RecoveryCountsAttempt, counts the lost attempt and fails
// the documents that used their last one).
func (s *Store) recover(ctx context.Context, t *table, timeout time.Duration, maxAttempts int) (recovered, dead int, err error) {
	now, err := s.serverNow(ctx)
	if err != nil {
		return 0, 0, err
	}
	stuck := bson.D{{Key: "status", Value: StatusProcessing}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "processedAt", Value: nil}},
		bson.D{{Key: "processedAt", Value: bson.D{{Key: "$lt", Value: now.Add(-timeout)}}}},
	}}}
	if s.core.RecoveryCounts {
		msg := seedcore.ErrorText(outbox.ErrorInfo{Code: "lease_expired", Message: "the processor did not finish the attempt in time"})
		res, err := t.coll.UpdateMany(ctx, append(stuck, bson.E{Key: "retryCount", Value: bson.D{{Key: "$gte", Value: maxAttempts - 1}}}),
			bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusFailed}, {Key: "processedAt", Value: now}, {Key: "errorMessage", Value: msg}}}})
		if err != nil {
			return 0, 0, err
		}
		dead = int(res.ModifiedCount)
		res, err = t.coll.UpdateMany(ctx, stuck, bson.D{
			{Key: "$set", Value: bson.D{{Key: "status", Value: StatusPending}, {Key: "processedAt", Value: nil}}},
			{Key: "$inc", Value: bson.D{{Key: "retryCount", Value: 1}}},
		})
		if err != nil {
			return 0, dead, err
		}
		return int(res.ModifiedCount), dead, nil
	}
	res, err := t.coll.UpdateMany(ctx, stuck, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: StatusPending}, {Key: "processedAt", Value: nil}}}})
	if err != nil {
		return 0, 0, err
	}
	return int(res.ModifiedCount), 0, nil
}
