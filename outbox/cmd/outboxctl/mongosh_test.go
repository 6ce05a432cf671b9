package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// mongoshPath finds the real mongosh: $OUTBOXKIT_MONGOSH (.ci/run installs
// it with npm and sets it), then PATH, then ~/.cache/outboxkit/mongosh.
// Without it the test skips, or fails when OUTBOXKIT_REQUIRE_BACKENDS=1.
func mongoshPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OUTBOXKIT_MONGOSH"); p != "" {
		return p
	}
	if p, err := exec.LookPath("mongosh"); err == nil {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "outboxkit", "mongosh", "node_modules", ".bin", "mongosh")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if testbackend.Required() {
		t.Fatal("mongosh is not installed (.ci/run installs it with npm) and OUTBOXKIT_REQUIRE_BACKENDS=1")
	}
	t.Skip("mongosh is not installed (npm install mongosh; or set OUTBOXKIT_MONGOSH)")
	return ""
}

// runMongosh runs a script with the real mongosh against url.
func runMongosh(t *testing.T, mongosh, url, script string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "script.js")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	// Generous: mongosh (node) takes seconds to start on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, mongosh, "--quiet", "--norc", url, file).CombinedOutput()
	if err != nil {
		t.Fatalf("mongosh %s: %v\n%s", file, err, out)
	}
}

// TestMigrateSQLMongoshGivesARunnableDatabase: the script `migrate sql`
// prints for MongoDB, run by the real mongosh, records the schema version, so migrate status answers 0 and a
// processor's Run starts and publishes; the --down script removes
// everything, version records included.
func TestMigrateSQLMongoshGivesARunnableDatabase(t *testing.T) {
	t.Parallel()
	mongosh := mongoshPath(t)
	db := testbackend.Mongo(t)
	url := mongoURL(t, db)
	script := mustCtl(t, "migrate", "sql", "--url", url)
	// Once: FerretDB v1.24 drops the connection on a createIndexes that
	// names several indexes that already exist (MongoDB answers ok), so
	// the script's rerun is not tested here.
	runMongosh(t, mongosh, url, script)
	if code, out, errOut := ctl(t, "migrate", "status", "--url", url); code != 0 || strings.Contains(out, "pending") {
		t.Fatalf("migrate status after the mongosh script: exit %d\n%s%s", code, out, errOut)
	}

	st, err := mongo.New(db.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{{Topic: "t", Payload: []byte(`{}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	published := make(chan struct{}, 1)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []outbox.Result {
		select {
		case published <- struct{}{}:
		default:
		}
		return make([]outbox.Result, len(msgs))
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(runCtx, st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: 50 * time.Millisecond})
	}()
	select {
	case err := <-done:
		stop()
		t.Fatalf("Run on a database set up by mongosh returned at once: %v", err)
	case <-published:
	case <-ctx.Done():
		t.Fatal("Run published nothing within 3 minutes")
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if m, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: res[0].Message.ID}); err != nil || m.Status != outbox.StatusSent {
		t.Fatalf("the message after Run: %v, %v; want SENT", m.Status, err)
	}

	runMongosh(t, mongosh, url, mustCtl(t, "migrate", "sql", "--down", "--url", url))
	names, err := db.DB.ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) != 0 {
		t.Fatalf("collections after the down script: %v, %v", names, err)
	}
	if code, _, errOut := ctl(t, "migrate", "status", "--url", url); code != 3 || !strings.Contains(errOut, "not migrated") {
		t.Fatalf("migrate status after the down script: exit %d, %s", code, errOut)
	}
}
