package whatsapp_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/whatsapp"
	"github.com/outboxkit/outboxkit/whatsapp/internal/statetest"
)

func randSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stateBackends are the State implementations the contract runs against.
var stateBackends = []struct {
	name string
	new  func(t *testing.T, opts whatsapp.QuotaOptions) whatsapp.State
}{
	{"memory", func(_ *testing.T, o whatsapp.QuotaOptions) whatsapp.State { return whatsapp.NewMemoryState(o) }},
	{"sqlite", newSQLiteTestState},
	{"postgres", newPostgresTestState},
	{"mysql", newMySQLTestState},
}

func newSQLiteTestState(t *testing.T, o whatsapp.QuotaOptions) whatsapp.State {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "wa.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return migrated(t, db, whatsapp.SQLOptions{Dialect: whatsapp.DialectSQLite, QuotaOptions: o})
}

func newPostgresTestState(t *testing.T, o whatsapp.QuotaOptions) whatsapp.State {
	dsn, why := testbackend.Lookup("OUTBOXKIT_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "127.0.0.1:5432")
	if dsn == "" {
		testbackend.Unavailable(t, "PostgreSQL", why)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	// The concurrent-senders case runs 100 goroutines: unbounded, the pool
	// opened a connection for each, and beside the other packages' tests
	// (run at the same time by go test ./...) the server refused some with
	// "too many clients". Ten connections still run the senders'
	// transactions concurrently.
	db.SetMaxOpenConns(10)
	schema := "wa_test_" + randSuffix()
	if _, err := db.Exec(`CREATE SCHEMA ` + schema); err != nil {
		_ = db.Close()
		testbackend.Unavailable(t, "PostgreSQL", err.Error())
	}
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		_ = db.Close()
	})
	return migrated(t, db, whatsapp.SQLOptions{Dialect: whatsapp.DialectPostgres, TablePrefix: schema + ".wa_", QuotaOptions: o})
}

func newMySQLTestState(t *testing.T, o whatsapp.QuotaOptions) whatsapp.State {
	dsn, why := testbackend.Lookup("OUTBOXKIT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test", "127.0.0.1:3306")
	if dsn == "" {
		testbackend.Unavailable(t, "MySQL", why)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10) // as for PostgreSQL
	if err := db.Ping(); err != nil {
		_ = db.Close()
		testbackend.Unavailable(t, "MySQL", err.Error())
	}
	prefix := "wa_" + randSuffix() + "_"
	t.Cleanup(func() {
		for _, tb := range []string{"session_window", "quota", "inbound_seen"} {
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + prefix + tb)
		}
		_ = db.Close()
	})
	return migrated(t, db, whatsapp.SQLOptions{Dialect: whatsapp.DialectMySQL, TablePrefix: prefix, QuotaOptions: o})
}

func migrated(t *testing.T, db *sql.DB, opts whatsapp.SQLOptions) *whatsapp.SQLState {
	t.Helper()
	s, err := whatsapp.NewSQLState(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	return s
}

func TestStateContract(t *testing.T) {
	t.Parallel()
	for _, b := range stateBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			statetest.Run(t, func(t *testing.T, o whatsapp.QuotaOptions) whatsapp.State { return b.new(t, o) }, statetest.Features{})
		})
	}
}

func TestNewSQLStateValidates(t *testing.T) {
	t.Parallel()
	db, _ := sql.Open("sqlite", filepath.Join(t.TempDir(), "x.db"))
	t.Cleanup(func() { _ = db.Close() })
	if _, err := whatsapp.NewSQLState(db, whatsapp.SQLOptions{}); err == nil {
		t.Fatal("no dialect accepted")
	}
	if _, err := whatsapp.NewSQLState(db, whatsapp.SQLOptions{Dialect: whatsapp.DialectSQLite, TablePrefix: "x; DROP TABLE y; --"}); err == nil {
		t.Fatal("an injected prefix accepted")
	}
}
