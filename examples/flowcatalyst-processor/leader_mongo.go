package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Timings of the MongoDB lease: it is renewed every mongoLeaseRenew and
// lapses mongoLeaseTTL after its last renewal (by the server's clock), so
// a replica that dies without releasing it is replaced within about
// mongoLeaseTTL + mongoLeaseRenew.
const (
	mongoLeaseTTL   = 15 * time.Second
	mongoLeaseRenew = 3 * time.Second
)

// mongoLeader is an outbox.Leader over one lease document in the locks
// collection, {_id: name, owner, expiresAt}. Taking it is an insert (the
// unique _id lets exactly one of concurrent inserts succeed); an expired
// lease is deleted (only while still expired) and inserted again; the
// holder renews it with an update fenced by its owner token and stops
// being the leader as soon as a renewal does not match, or when it can no
// longer renew before the lease would lapse. A clean stop deletes it.
type mongoLeader struct {
	coll   *mongo.Collection
	name   string
	owner  string
	log    *slog.Logger
	leader atomic.Bool
}

func newMongoLeader(coll *mongo.Collection, name string, log *slog.Logger) *mongoLeader {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &mongoLeader{coll: coll, name: name, owner: hex.EncodeToString(b[:]), log: log}
}

// IsLeader reports whether this processor holds the lease.
func (l *mongoLeader) IsLeader() bool { return l.leader.Load() }

// serverNow is the server's clock (hello's localTime).
func (l *mongoLeader) serverNow(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := l.coll.Database().RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, err
	}
	if hello.LocalTime.IsZero() {
		return time.Now().UTC(), nil
	}
	return hello.LocalTime.UTC(), nil
}

// tick takes or renews the lease and reports whether this process holds it.
func (l *mongoLeader) tick(ctx context.Context) (bool, error) {
	now, err := l.serverNow(ctx)
	if err != nil {
		return false, err
	}
	exp := now.Add(mongoLeaseTTL)
	if l.leader.Load() {
		res, err := l.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "owner", Value: l.owner}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: exp}}}})
		if err != nil {
			return false, err
		}
		return res.MatchedCount == 1, nil
	}
	_, err = l.coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "expiresAt", Value: bson.D{{Key: "$lt", Value: now}}}})
	if err != nil {
		return false, err
	}
	_, err = l.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "owner", Value: l.owner}, {Key: "expiresAt", Value: exp}})
	if mongo.IsDuplicateKeyError(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Read it back: only the owner written last holds it.
	var doc struct {
		Owner string `bson:"owner"`
	}
	if err := l.coll.FindOne(ctx, bson.D{{Key: "_id", Value: l.name}}).Decode(&doc); err != nil {
		if errors.Is(err, mongo.ErrNoDocuments) {
			return false, nil
		}
		return false, err
	}
	return doc.Owner == l.owner, nil
}

func (l *mongoLeader) start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(mongoLeaseRenew)
		defer t.Stop()
		var renewed time.Time
		for {
			held, err := l.tick(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				// Keep leading only while the lease cannot have lapsed.
				if l.leader.Load() && time.Since(renewed) > mongoLeaseTTL-2*mongoLeaseRenew {
					l.leader.Store(false)
					l.log.Warn("single-active: could not renew the lease; no longer the active processor", "err", err)
				}
			case err == nil && held:
				renewed = time.Now()
				if !l.leader.Swap(true) {
					l.log.Info("single-active: this processor is now the active one")
				}
			case err == nil && l.leader.Swap(false):
				l.log.Warn("single-active: another processor took the lease")
			}
			select {
			case <-ctx.Done():
				if l.leader.Swap(false) {
					ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					_, _ = l.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "owner", Value: l.owner}})
					cancel()
				}
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
