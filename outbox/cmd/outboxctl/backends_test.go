package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// kinds are the stores every per-backend test runs against.
var kinds = []string{"sqlite", "postgres", "mysql", "mongo"}

// backend is a fresh, empty database of one kind for one test.
type backend struct {
	kind string
	// args name it on the command line: --url (and --schema).
	args []string
	// objects counts what exists of it: tables or collections, -1 when
	// the database itself (a SQLite file) does not exist.
	objects func() int
}

// with returns args followed by b's connection flags.
func (b backend) with(args ...string) []string { return append(args, b.args...) }

func newBackend(t *testing.T, kind string) backend {
	t.Helper()
	ctx := context.Background()
	switch kind {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "ops.db")
		return backend{kind: kind, args: []string{"--url", "sqlite://" + path}, objects: func() int {
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				return -1
			}
			db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
	case "postgres":
		pg := testbackend.Postgres(t, 2)
		return backend{kind: kind, args: []string{"--url", pg.DSN, "--schema", pg.Name}, objects: func() int {
			var n int
			if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, pg.Name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
	case "mysql":
		my := testbackend.MySQL(t, 2)
		cfg, err := gomysql.ParseDSN(my.DSN)
		if err != nil {
			t.Fatal(err)
		}
		return backend{kind: kind, args: []string{"--url", mysqlURL(cfg, my.Name)}, objects: func() int {
			var n int
			if err := my.DB.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = ?`, my.Name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
	case "mongo":
		db := testbackend.Mongo(t)
		return backend{kind: kind, args: []string{"--url", mongoURL(t, db)}, objects: func() int {
			names, err := db.DB.ListCollectionNames(ctx, bson.D{})
			if err != nil {
				t.Fatal(err)
			}
			return len(names)
		}}
	}
	t.Fatalf("unknown backend %q", kind)
	return backend{}
}

// eachBackend runs f in a parallel subtest per backend.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f(t, newBackend(t, kind))
		})
	}
}

// mysqlURL is the outboxctl URL of database db on the server of cfg.
func mysqlURL(cfg *gomysql.Config, db string) string {
	url := "mysql://" + cfg.User
	if cfg.Passwd != "" {
		url += ":" + cfg.Passwd
	}
	return url + "@" + cfg.Addr + "/" + db
}

// conn returns the connection flags of b, opening in mode.
func (b backend) conn(mode openMode) conn {
	c := conn{mode: mode}
	for i := 0; i+1 < len(b.args); i += 2 {
		switch b.args[i] {
		case "--url":
			c.url = b.args[i+1]
		case "--schema":
			c.schema = b.args[i+1]
		}
	}
	return c
}

// openStore opens b's store as the CLI does, for a test to seed it.
func openStore(t *testing.T, b backend) *target {
	t.Helper()
	c := b.conn(needSchema)
	tg, err := c.open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.close)
	return tg
}

// seed enqueues one message per (topic, status) pair and moves it to that
// status: PENDING, SENT, FAILED (a dead letter) or CANCELLED. It returns
// the IDs by "topic/STATUS".
func seed(t *testing.T, st outbox.Store, pairs ...string) map[string]string {
	t.Helper()
	ctx := context.Background()
	enq, ok := st.(interface {
		MessageEnqueue(context.Context, outbox.MessageEnqueueParams) ([]outbox.Enqueued, error)
	})
	if !ok {
		t.Fatalf("%T cannot enqueue", st)
	}
	ids := map[string]string{}
	want := map[string]outbox.Status{}
	for i, p := range pairs {
		topic, status, _ := strings.Cut(p, "/")
		res, err := enq.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{{
			Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), Headers: map[string]string{"h": "v"}}}})
		if err != nil {
			t.Fatal(err)
		}
		ids[p], want[res[0].Message.ID] = res[0].Message.ID, outbox.Status(status)
	}
	claimed, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 100, Owner: "seed", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	fin := outbox.MessageFinishParams{Owner: "seed", Now: time.Now()}
	for _, m := range claimed {
		o := outbox.Outcome{ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, StartedAt: time.Now()}
		switch want[m.ID] {
		case outbox.StatusSent:
			o.Kind = outbox.OutcomeSent
		case outbox.StatusFailed:
			o.Kind, o.Error = outbox.OutcomeDead, &outbox.ErrorInfo{Code: "http_400", Message: "bad request"}
		default:
			o.Kind = outbox.OutcomeReleased
		}
		fin.Outcomes = append(fin.Outcomes, o)
	}
	if _, err := st.MessageFinish(ctx, fin); err != nil {
		t.Fatal(err)
	}
	for id, s := range want {
		if s == outbox.StatusCancelled {
			if _, err := st.MessageCancel(ctx, outbox.MessageCancelParams{ID: id}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids
}

// counts returns the store's counts by status, every tenant.
func counts(t *testing.T, st outbox.Store) map[outbox.Status]int64 {
	t.Helper()
	c, err := st.MessageCount(context.Background(), outbox.MessageCountParams{AllTenants: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
