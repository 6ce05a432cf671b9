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
