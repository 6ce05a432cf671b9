package mongo_test

import (
	"context"
	"log"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// Enqueue a message in the same MongoDB transaction as a business write:
// the session travels in the context the callback receives, and that
// context is also the outbox's transaction. On a replica set both
// documents commit or neither does; on a server without transactions the
// message is written at once.
func Example_withTransaction() {
	ctx := context.Background()
	client, err := mongodrv.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017/?replicaSet=rs0"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)
	db := client.Database("shop")
	store, err := mongo.New(db, mongo.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob := outbox.New[context.Context](store, outbox.Options{})

	sess, err := client.StartSession()
	if err != nil {
		log.Fatal(err)
	}
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if _, err := db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: "order-1"}, {Key: "total", Value: 42}}); err != nil {
			return nil, err
		}
		return ob.EnqueueTx(ctx, ctx, outbox.Message{
			Topic: "orders", Group: "order-1", IdempotencyKey: "order-1-created",
			Payload: []byte(`{"order":"order-1","event":"created"}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	store.Notify() // or rely on change streams
}

// Single-active mode: of all replicas running this, only the leader
// claims. The leader renews a lease document; when its process dies, the
// lease expires and another replica takes over within LeaseTTL plus its
// RetryInterval (at once when a leader stops cleanly).
func ExampleElector() {
	ctx := context.Background()
	client, err := mongodrv.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)
	store, err := mongo.New(client.Database("shop"), mongo.Options{})
	if err != nil {
		log.Fatal(err)
	}
	publisher := outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result { return outbox.Result{} })

	el := store.Elector(mongo.ElectorOptions{}) // lease of 15 s, renewed every 2 s
	// Either run the processor only while leading ...
	go func() {
		_ = el.Run(ctx, func(ctx context.Context) {
			_ = outbox.Run(ctx, store, publisher, outbox.Config{Topics: []string{"orders"}})
		})
	}()
	// ... or keep it running and let it idle while not leading:
	//	go el.Run(ctx, nil)
	//	outbox.Run(ctx, store, publisher, outbox.Config{Leader: el})
}
