package mongo_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// TestElectorConformance runs the election cases of the conformance suite
// against the lease-document Elector, each on a fresh database. Every
// elector has a client of its own, so that Sever can disconnect one
// leader as a network loss would.
func TestElectorConformance(t *testing.T) {
	t.Parallel()
	storetest.RunElector(t, storetest.ElectorHarness{NewElection: func(t *testing.T) storetest.Election {
		st, db := newStore(t, mongo.Options{})
		opts := mongo.ElectorOptions{RetryInterval: 200 * time.Millisecond, CheckInterval: 300 * time.Millisecond, LeaseTTL: 3 * time.Second}
		id := mongo.ElectorLeaseID(st.Elector(opts))
		var (
			mu      sync.Mutex
			clients = map[storetest.Elector]*mongodrv.Client{}
		)
		uri := testbackend.MongoURI(t)
		return storetest.Election{
			New: func(t *testing.T) storetest.Elector {
				c, err := mongodrv.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(2).SetTimeout(20 * time.Second))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
				s, err := mongo.New(c.Database(db.DB.Name()), mongo.Options{})
				if err != nil {
					t.Fatal(err)
				}
				e := s.Elector(opts)
				mu.Lock()
				clients[e] = c
				mu.Unlock()
				return e
			},
			Held: func(ctx context.Context) (bool, error) {
				err := st.Database().Collection("outbox_locks").FindOne(ctx, bson.D{{Key: "_id", Value: id},
					{Key: "expires_at", Value: bson.D{{Key: "$gt", Value: time.Now().UTC()}}}}).Err()
				if errors.Is(err, mongodrv.ErrNoDocuments) {
					return false, nil
				}
				return err == nil, err
			},
			Sever: func(ctx context.Context, leader storetest.Elector) error {
				mu.Lock()
				c := clients[leader]
				mu.Unlock()
				return c.Disconnect(ctx)
			},
			Bound: opts.LeaseTTL + opts.RetryInterval,
		}
	}})
}

// A lease that could lapse between two renewals is refused.
func TestElectorRefusesShortLease(t *testing.T) {
	t.Parallel()
	st, err := mongo.New(testbackend.Mongo(t).DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = st.Elector(mongo.ElectorOptions{CheckInterval: time.Second, LeaseTTL: 2 * time.Second}).Run(ctx, nil)
	if !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("Run with LeaseTTL = 2 x CheckInterval returned %v, want ErrInvalidInput", err)
	}
}

// A leader whose lease was taken over stops leading at its next renewal,
// which its owner and epoch fence, long before its own lease would have
// lapsed; a lease taken over after it expired gets the next epoch.
func TestElectorRenewalFencedByOwnerAndEpoch(t *testing.T) {
	t.Parallel()
	db := testbackend.Mongo(t)
	st, err := mongo.New(db.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A lease of a minute: nothing here waits for one to lapse.
	el := st.Elector(mongo.ElectorOptions{RetryInterval: 50 * time.Millisecond, CheckInterval: 200 * time.Millisecond, LeaseTTL: time.Minute})
	id := mongo.ElectorLeaseID(el)
	locks := db.DB.Collection("outbox_locks")
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx, nil) }()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited 30 s for %s", what)
			}
		}
	}
	waitUntil("the elector to lead", el.IsLeader)
	var lease struct {
		Owner string `bson:"owner"`
		Epoch int64  `bson:"epoch"`
	}
	if err := locks.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&lease); err != nil {
		t.Fatal(err)
	}
	if lease.Epoch != 1 {
		t.Fatalf("a free lease taken with epoch %d, want 1", lease.Epoch)
	}
	// Another term's lease, as a takeover would leave it, under the same
	// owner: only the epoch tells the terms apart.
	if _, err := locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		t.Fatal(err)
	}
	owner := lease.Owner
	if _, err := locks.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "owner", Value: owner},
		{Key: "epoch", Value: int64(2)}, {Key: "expires_at", Value: time.Now().Add(time.Hour).UTC()}}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the leader to notice the lease was taken", func() bool { return !el.IsLeader() })
	// That lease expires: the elector takes it over, with the next epoch.
	if _, err := locks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: time.Now().Add(-time.Second).UTC()}}}}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the elector to take the expired lease over", el.IsLeader)
	if err := locks.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&lease); err != nil {
		t.Fatal(err)
	}
	if lease.Owner != owner || lease.Epoch != 3 {
		t.Fatalf("the lease taken over is %+v, want owner %s, epoch 3", lease, owner)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n, err := locks.CountDocuments(context.Background(), bson.D{{Key: "_id", Value: id}}); err != nil || n != 0 {
		t.Fatalf("%d lease documents after Run returned (%v), want the lease deleted", n, err)
	}
}
