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
)

// lockTTL is how long a claim lock of a processor that died blocks its
// group. A claim holds its locks for a few round trips only.
const lockTTL = 30 * time.Second

// lockChunk is the first batch of lock documents a claim inserts;
// later batches double up to maxLockChunk.
const lockChunk = 8

// maxLockChunk bounds the lock documents one insert carries.
const maxLockChunk = 64

// lockID names the lock of group g of collection coll; the length prefix
// keeps every (collection, group) pair distinct.
func lockID(coll string, g *string) string {
	if g == nil {
		return strconv.Itoa(len(coll)) + ":" + coll + ":null"
	}
	return strconv.Itoa(len(coll)) + ":" + coll + ":g:" + *g
}

// lockGroups takes the locks of the groups it can, taking over locks
// whose holder died (expired), and returns the groups it locked, in order.
func (s *Store) lockGroups(ctx context.Context, t *table, groups []*string, token string, now time.Time) ([]*string, error) {
	won, lost, err := s.insertLocks(ctx, t, groups, token, now)
	if err != nil || len(lost) == 0 {
		return won, err
	}
	ids := make(bson.A, len(lost))
	for i, g := range lost {
		ids[i] = lockID(t.raw, g)
	}
	res, err := s.locks.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}},
		{Key: "expiresAt", Value: bson.D{{Key: "$lt", Value: now}}}})
	if err != nil || res.DeletedCount == 0 {
		return won, nil //nolint:nilerr // the groups held by others are skipped this time
	}
	more, _, err := s.insertLocks(ctx, t, lost, token, now)
	if err != nil {
		return won, nil //nolint:nilerr // as above
	}
	return append(won, more...), nil
}

// insertLocks inserts the lock documents of groups: won are the groups
// whose insert succeeded, lost those another claimer holds.
func (s *Store) insertLocks(ctx context.Context, t *table, groups []*string, token string, now time.Time) (won, lost []*string, err error) {
	docs := make([]any, len(groups))
	for i, g := range groups {
		docs[i] = bson.D{{Key: "_id", Value: lockID(t.raw, g)}, {Key: "owner", Value: token}, {Key: "expiresAt", Value: now.Add(lockTTL)}}
	}
	_, err = s.locks.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return groups, nil, nil
	}
	var bw mongo.BulkWriteException
	ok := errors.As(err, &bw) && bw.WriteConcernError == nil
	dup := map[int]bool{}
	for _, we := range bw.WriteErrors {
		ok = ok && we.HasErrorCode(11000)
		dup[we.Index] = true
	}
	if !ok {
		s.unlockGroups(context.WithoutCancel(ctx), t, groups, token)
		return nil, nil, fmt.Errorf("locks: %w", err)
	}
	for i, g := range groups {
		if dup[i] {
			lost = append(lost, g)
		} else {
			won = append(won, g)
		}
	}
	return won, lost, nil
}

func (s *Store) unlockGroups(ctx context.Context, t *table, groups []*string, token string) {
	if len(groups) == 0 {
		return
	}
	ids := make(bson.A, len(groups))
	for i, g := range groups {
		ids[i] = lockID(t.raw, g)
	}
	if _, err := s.locks.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "owner", Value: token}}); err != nil {
		s.core.Log.WarnContext(ctx, "seedstore: releasing claim locks failed; they expire", "collection", t.raw, "err", err, "ttl", lockTTL)
	}
}
