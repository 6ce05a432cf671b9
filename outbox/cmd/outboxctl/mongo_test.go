package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// mongoURL is the test server's URI with db as its database.
func mongoURL(t *testing.T, db testbackend.MongoDatabase) string {
	t.Helper()
	uri := testbackend.MongoURI(t)
	scheme, rest, _ := strings.Cut(uri, "://")
	hosts, query, _ := strings.Cut(rest, "?")
	hosts, _, _ = strings.Cut(hosts, "/")
	u := scheme + "://" + hosts + "/" + db.DB.Name()
	if query != "" {
		u += "?" + query
	}
	return u
}

var (
	runCommandLine = regexp.MustCompile(`^db\.runCommand\((.*)\);$`)
	dropLine       = regexp.MustCompile(`^db\.getCollection\(("[^"]*")\)\.drop\(\);$`)
)

// mongosh applies a `migrate sql` script to db line by line as mongosh
// would: db.runCommand(doc) sends doc (read as Extended JSON, in its key
// order) as a command; db.getCollection(name).drop() drops a collection.
// Any other line that is not a comment fails the test.
func mongosh(t *testing.T, db testbackend.MongoDatabase, script string) {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, line := range strings.Split(script, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "//"):
		case runCommandLine.MatchString(line):
			var cmd bson.D
			if err := bson.UnmarshalExtJSON([]byte(runCommandLine.FindStringSubmatch(line)[1]), false, &cmd); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if err := db.DB.RunCommand(ctx, cmd).Err(); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			n++
		case dropLine.MatchString(line):
			name, err := strconv.Unquote(dropLine.FindStringSubmatch(line)[1])
			if err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Collection(name).Drop(ctx); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			n++
		default:
			t.Fatalf("migrate sql printed a line that is neither a comment nor a command: %q", line)
		}
	}
	if n == 0 {
		t.Fatalf("migrate sql printed no commands:\n%s", script)
	}
}

// mongoSchema lists db's collections but the version record, each with its
// index specifications (name, key, unique).
func mongoSchema(t *testing.T, db testbackend.MongoDatabase) []string {
	t.Helper()
	ctx := context.Background()
	names, err := db.DB.ListCollectionNames(context.Background(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	var out []string
	for _, c := range names {
		if strings.HasSuffix(c, "migrations") {
			continue
		}
		cur, err := db.DB.Collection(c).Indexes().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ixs []struct {
			Name   string `bson:"name"`
			Key    bson.D `bson:"key"`
			Unique bool   `bson:"unique"`
		}
		if err := cur.All(ctx, &ixs); err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(ixs, func(a, b struct {
			Name   string `bson:"name"`
			Key    bson.D `bson:"key"`
			Unique bool   `bson:"unique"`
		}) int {
			return strings.Compare(a.Name, b.Name)
		})
		for _, ix := range ixs {
			out = append(out, fmt.Sprintf("%s\t%s\t%v\tunique=%v", c, ix.Name, ix.Key, ix.Unique))
		}
	}
	return out
}

// TestMigrateSQLMongo: `migrate sql` on a mongodb:// URL prints mongosh
// commands that, applied, give the collections and indexes Migrate
// creates; its --down commands remove them.
func TestMigrateSQLMongo(t *testing.T) {
	t.Parallel()
	a, b := testbackend.Mongo(t), testbackend.Mongo(t)
	mustCtl(t, "migrate", "up", "--url", mongoURL(t, a))
	script := mustCtl(t, "migrate", "sql", "--url", mongoURL(t, b))
	if !strings.HasPrefix(script, "// outboxkit mongo schema: 2 migrations") || !strings.Contains(script, "// 002_admin.up.js") {
		t.Fatalf("migrate sql:\n%s", script)
	}
	// Rendering needs no server.
	if offline := mustCtl(t, "migrate", "sql", "--url", "mongodb://127.0.0.1:1/"+b.DB.Name()); offline != script {
		t.Fatalf("migrate sql without a server printed:\n%s", offline)
	}
	mongosh(t, b, script)
	sameLines(t, "MongoDB collections and indexes", mongoSchema(t, a), mongoSchema(t, b))
	// The script records the schema version, as Migrate does.
	if code, out, errOut := ctl(t, "migrate", "status", "--url", mongoURL(t, b)); code != 0 || strings.Contains(out, "pending") {
		t.Fatalf("migrate status after the script: exit %d\n%s%s", code, out, errOut)
	}

	mongosh(t, b, mustCtl(t, "migrate", "sql", "--down", "--url", mongoURL(t, b)))
	if left := mongoSchema(t, b); len(left) != 0 {
		t.Fatalf("after the down commands: %v", left)
	}
}

// TestMongoSession drives every command against MongoDB (FerretDB in CI),
// as an operator would.
func TestMongoSession(t *testing.T) {
	t.Parallel()
	db := testbackend.Mongo(t)
	url := mongoURL(t, db)
	if out := mustCtl(t, "migrate", "up", "--url", url); !strings.Contains(out, "mongo schema version 2") {
		t.Fatalf("migrate up: %s", out)
	}
	if out := mustCtl(t, "migrate", "status", "--url", url); !strings.Contains(out, "001_init\tapplied") || !strings.Contains(out, "002_admin\tapplied") {
		t.Fatalf("migrate status: %s", out)
	}

	st, err := mongo.New(db.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	operatorSession(t, url, st, outbox.New(st, outbox.Options{}).Enqueue)

	// Bad usage particular to MongoDB: exit 2.
	noDB := strings.Replace(url, "/"+db.DB.Name(), "/", 1)
	for _, args := range [][]string{
		{"stats", "--url", noDB},                     // no database
		{"stats", "--url", url, "--schema", "x"},     // a PostgreSQL flag
		{"migrate", "up", "--url", url, "--to", "9"}, // an unknown version
	} {
		if code, _, errOut := ctl(t, args...); code != 2 || errOut == "" {
			t.Errorf("outboxctl %v: exit %d (%q), want 2 with a message", args, code, errOut)
		}
	}
	// A server that does not answer: exit 1, the password not printed.
	code, _, errOut := ctl(t, "stats", "--url", "mongodb://ops:s3cr3t-pw@127.0.0.1:1,127.0.0.1:2/db?serverSelectionTimeoutMS=200")
	if code != 1 || strings.Contains(errOut, "s3cr3t-pw") || !strings.Contains(errOut, "ops:xxxxx@") {
		t.Errorf("stats on a dead server: exit %d, %q; want 1 and the password masked", code, errOut)
	}

	if out := mustCtl(t, "migrate", "down", "--url", url, "--to", "0", "--yes"); !strings.Contains(out, "schema version 0") {
		t.Fatalf("migrate down: %s", out)
	}
	names, err := db.DB.ListCollectionNames(context.Background(), bson.D{})
	if err != nil || len(names) != 0 {
		t.Fatalf("collections after migrate down: %v, %v", names, err)
	}
}
