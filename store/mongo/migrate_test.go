package mongo_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// indexNames returns the index names of a collection ("" entries for a
// collection that does not exist).
func indexNames(t *testing.T, db testbackend.MongoDatabase, coll string) []string {
	t.Helper()
	ctx := context.Background()
	names, err := db.DB.ListCollectionNames(ctx, bson.D{{Key: "name", Value: coll}})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		return nil
	}
	cur, err := db.DB.Collection(coll).Indexes().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ixs []struct {
		Name string `bson:"name"`
	}
	if err := cur.All(ctx, &ixs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ix := range ixs {
		out = append(out, ix.Name)
	}
	slices.Sort(out)
	return out
}

func TestMigrateVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testbackend.Mongo(t)
	s, err := mongo.New(db.DB, mongo.Options{TablePrefix: "ob_"})
	if err != nil {
		t.Fatal(err)
	}
	version := func(want int) {
		t.Helper()
		if v, err := s.SchemaVersion(ctx); err != nil || v != want {
			t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, want)
		}
	}
	version(0)
	migs := s.Migrations()
	if len(migs) != 2 || migs[0].Version != 1 || migs[1].Name != "admin" ||
		!strings.Contains(migs[0].Up, `db.runCommand({"createIndexes":"ob_messages"`) ||
		!strings.Contains(migs[0].Down, `db.getCollection("ob_messages").drop();`) {
		t.Fatalf("Migrations() = %+v", migs)
	}

	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	version(2)
	if got := indexNames(t, db, "ob_messages"); !slices.Contains(got, "status_topic_created") || !slices.Contains(got, "tenant_key") {
		t.Fatalf("indexes after Migrate: %v", got)
	}
	if err := s.MigrateTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	version(1)
	if got := indexNames(t, db, "ob_messages"); slices.Contains(got, "status_topic_created") || !slices.Contains(got, "claim") {
		t.Fatalf("indexes at version 1: %v", got)
	}
	if got := indexNames(t, db, "ob_pauses"); got != nil {
		t.Fatalf("ob_pauses still exists at version 1: %v", got)
	}
	if err := s.MigrateTo(ctx, 3); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("MigrateTo(3) = %v, want ErrInvalidInput", err)
	}
	version(1)

	// A database whose indexes were made before versions were recorded
	// migrates over them.
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.DB.Collection("ob_migrations").DeleteMany(ctx, bson.D{}); err != nil {
		t.Fatal(err)
	}
	version(0)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over unrecorded indexes: %v", err)
	}
	version(2)

	if err := s.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	version(0)
	left, err := db.DB.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range left {
		if strings.HasPrefix(c, "ob_") {
			t.Errorf("collection %s is left after MigrateDown", c)
		}
	}
}
