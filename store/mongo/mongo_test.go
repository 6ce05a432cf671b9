package mongo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// newStore returns a migrated store on a fresh database.
func newStore(t testing.TB, opts mongo.Options) (*mongo.Store, testbackend.MongoDatabase) {
	t.Helper()
	db := testbackend.Mongo(t)
	s, err := mongo.New(db.DB, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, db
}

// lacks probes the test server once: a replica set has transactions and
// change streams; FerretDB and standalone servers have neither.
func lacks(t *testing.T) []storetest.Capability {
	db := testbackend.Mongo(t)
	// Two transactions writing the same document conflict at once on
	// MongoDB instead of waiting: never the SQL stores' lock wait.
	out := []storetest.Capability{storetest.CapLockWait}
	if !db.ReplicaSet {
		t.Logf("the server is not a replica set: no transactions, no change streams")
		out = append(out, storetest.CapTransactions)
	}
	return out
}

func TestConformance(t *testing.T) {
	missing := lacks(t)
	storetest.Run(t, storetest.Harness[context.Context]{
		NewBackend: func(t *testing.T) storetest.Backend[context.Context] {
			s, db := newStore(t, mongo.Options{})
			return storetest.Backend[context.Context]{
				Store:    s,
				Enqueuer: s,
				Inbox:    s,
				Begin: func(ctx context.Context) (context.Context, error) {
					sess, err := db.Client.StartSession()
					if err != nil {
						return nil, err
					}
					if db.ReplicaSet {
						if err := sess.StartTransaction(); err != nil {
							sess.EndSession(ctx)
							return nil, err
						}
					}
					return mongodrv.NewSessionContext(ctx, sess), nil
				},
				Commit: func(ctx context.Context, tx context.Context) error {
					sess := mongodrv.SessionFromContext(tx)
					defer sess.EndSession(ctx)
					if sess.TransactionRunning() {
						return sess.CommitTransaction(ctx)
					}
					return nil
				},
				Rollback: func(ctx context.Context, tx context.Context) error {
					sess := mongodrv.SessionFromContext(tx)
					defer sess.EndSession(ctx)
					if sess.TransactionRunning() {
						return sess.AbortTransaction(ctx)
					}
					return nil
				},
				Usable: func(ctx context.Context, tx context.Context) error {
					err := s.Messages().FindOne(tx, bson.D{}).Err()
					if errors.Is(err, mongodrv.ErrNoDocuments) {
						return nil
					}
					return err
				},
			}
		},
		Features: storetest.Features{ConcurrentWriters: true, ProcessorMessages: 400, Lacks: missing},
	})
}

// A processor on a store whose Migrate never ran refuses to start with
// ErrNotMigrated (its claim would lack the unique indexes FIFO rests on);
// after Migrate, the probe passes.
func TestRunRefusesAnUnmigratedStore(t *testing.T) {
	t.Parallel()
	db := testbackend.Mongo(t)
	s, err := mongo.New(db.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := outbox.NewProcessor(s, outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		return make([]outbox.Result, len(ms))
	}), outbox.Config{AllTopics: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(ctx); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Run on an unmigrated store returned %v, want ErrNotMigrated", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after Migrate: %v", err)
	}
}
