package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Locks are documents of the locks collection whose _id names what they
// lock: a group ("g" + group key) or one unordered message ("m" + ID). The
// unique _id makes taking a lock one atomic insert: of several processes
// inserting the same _id, exactly one succeeds, on every server that
// enforces unique indexes. A lock whose holder died is taken over once it
// has expired (Options.LockTTL).
type lockDoc struct {
	ID      string    `bson:"_id"`
	Owner   string    `bson:"owner"`
	Expires time.Time `bson:"expires_at"`
}

func lockKeyGroup(gkey string) string { return "g" + gkey }
func lockKeyMessage(id string) string { return "m" + id }

// tryLock takes the locks of keys it can and returns those it took.
func (s *Store) tryLock(ctx context.Context, keys []string, owner string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	won, lost, err := s.insertLocks(ctx, keys, owner)
	if err != nil || len(lost) == 0 {
		return won, err
	}
	// Take over the expired ones.
	res, err := s.locks.DeleteMany(ctx, bson.D{
		{Key: "_id", Value: bson.D{{Key: "$in", Value: lost}}},
		{Key: "expires_at", Value: bson.D{{Key: "$lt", Value: time.Now().UTC()}}},
	})
	if err != nil {
		s.unlock(context.WithoutCancel(ctx), won, owner)
		return nil, fmt.Errorf("locks: %w", err)
	}
	if res.DeletedCount == 0 {
		return won, nil
	}
	more, _, err := s.insertLocks(ctx, lost, owner)
	if err != nil {
		s.unlock(context.WithoutCancel(ctx), won, owner)
		return nil, err
	}
	return append(won, more...), nil
}

func (s *Store) insertLocks(ctx context.Context, keys []string, owner string) (won, lost []string, err error) {
	for start := 0; start < len(keys); start += maxIDs {
		w, l, err := s.insertLockChunk(ctx, keys[start:min(start+maxIDs, len(keys))], owner)
		if err != nil {
			s.unlock(context.WithoutCancel(ctx), won, owner)
			return nil, nil, err
		}
		won, lost = append(won, w...), append(lost, l...)
	}
	return won, lost, nil
}

func (s *Store) insertLockChunk(ctx context.Context, keys []string, owner string) (won, lost []string, err error) {
	exp := time.Now().UTC().Add(s.opts.LockTTL)
	docs := make([]any, len(keys))
	for i, k := range keys {
		docs[i] = lockDoc{ID: k, Owner: owner, Expires: exp}
	}
	_, err = s.locks.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return keys, nil, nil
	}
	dups, ok := dupIndexes(err)
	if !ok {
		s.unlock(context.WithoutCancel(ctx), keys, owner)
		return nil, nil, fmt.Errorf("locks: %w", err)
	}
	for i, k := range keys {
		if dups[i] {
			lost = append(lost, k)
		} else {
			won = append(won, k)
		}
	}
	return won, lost, nil
}

// lockWait takes every lock of keys, waiting for the ones held, until ctx
// ends or twice the lock TTL has passed.
func (s *Store) lockWait(ctx context.Context, keys []string, owner string) error {
	var held []string
	need := keys
	deadline := time.Now().Add(2 * s.opts.LockTTL)
	pause := time.Millisecond
	for {
		won, err := s.tryLock(ctx, need, owner)
		if err != nil {
			s.unlock(context.WithoutCancel(ctx), held, owner)
			return err
		}
		held = append(held, won...)
		if len(held) == len(keys) {
			return nil
		}
		got := map[string]bool{}
		for _, k := range held {
			got[k] = true
		}
		need = need[:0:0]
		for _, k := range keys {
			if !got[k] {
				need = append(need, k)
			}
		}
		if time.Now().After(deadline) {
			s.unlock(context.WithoutCancel(ctx), held, owner)
			return fmt.Errorf("locks: %d group locks still held by others after %s", len(need), 2*s.opts.LockTTL)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			s.unlock(context.WithoutCancel(ctx), held, owner)
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// unlock releases the locks of keys that owner holds. A failure is logged:
// the locks then expire.
func (s *Store) unlock(ctx context.Context, keys []string, owner string) {
	for start := 0; start < len(keys); start += maxIDs {
		chunk := keys[start:min(start+maxIDs, len(keys))]
		_, err := s.locks.DeleteMany(ctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "$in", Value: chunk}}},
			{Key: "owner", Value: owner},
		})
		if err != nil {
			s.log.Warn("mongo: releasing locks failed; they expire after the lock TTL", "locks", len(chunk), "error", err)
		}
	}
}
