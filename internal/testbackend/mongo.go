package testbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoDefaultURI is the CI machine's server: FerretDB, which .ci/run
// builds and starts on the MongoDB port.
const MongoDefaultURI = "mongodb://127.0.0.1:27017"

// MongoURI returns the URI of the test MongoDB: OUTBOXKIT_MONGO_URI, else
// the local server on 127.0.0.1:27017 when it answers. When neither works
// t is skipped (or fails when backends are required).
func MongoURI(t testing.TB) string {
	t.Helper()
	uri, why := Lookup("OUTBOXKIT_MONGO_URI", MongoDefaultURI, "127.0.0.1:27017")
	if uri == "" {
		Unavailable(t, "MongoDB", why)
	}
	return uri
}

// MongoDatabase is one test's isolated database on the test server.
type MongoDatabase struct {
	Client *mongo.Client
	// DB is a fresh database, dropped when the test ends.
	DB *mongo.Database
	// ReplicaSet reports that the server is a replica set member (or a
	// mongos): it has multi-document transactions and change streams.
	ReplicaSet bool
}

// Mongo returns a client and a fresh database (outboxkit_t_<random>) on the
// test server, unique to t. The database is dropped and the client
// disconnected when t ends.
func Mongo(t testing.TB) MongoDatabase {
	t.Helper()
	uri := MongoURI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// A small pool: FerretDB v1 over PostgreSQL can deadlock its own
	// PostgreSQL pool when many updates arrive at once (each holds one
	// connection while it waits for a second). An operation that still
	// hangs there is cut off after 20 s (the client-side operation timeout
	// closes its connection), so the caller sees an error and retries
	// instead of waiting forever.
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(5 * time.Second).
		SetMaxPoolSize(4).SetTimeout(20 * time.Second))
	if err != nil {
		t.Fatalf("testbackend: MongoDB client: %v", err)
	}
	var hello bson.M
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		_ = client.Disconnect(ctx)
		Unavailable(t, "MongoDB", "hello: "+err.Error())
	}
	_, rs := hello["setName"]
	msg, _ := hello["msg"].(string)
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := client.Database("outboxkit_t_" + hex.EncodeToString(b[:]))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = db.Drop(ctx)
		_ = client.Disconnect(ctx)
	})
	return MongoDatabase{Client: client, DB: db, ReplicaSet: rs || msg == "isdbgrid"}
}
