package mysql_test

import (
	"context"
	"database/sql"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// newStore returns a migrated store on a fresh database.
func newStore(t testing.TB, opts mysql.Options) (*mysql.Store, testbackend.MySQLDatabase) {
	t.Helper()
	d := testbackend.MySQL(t, 10)
	st, err := mysql.New(d.DB, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return st, d
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[*sql.Tx] {
			st, _ := newStore(t, mysql.Options{})
			return storetest.SQLBackend(st)
		},
		Features: storetest.Features{ConcurrentWriters: true, ProcessorMessages: processorMessages()},
	})
}

// processorMessages is the size of the processor-tier FIFO test.
func processorMessages() int {
	if testing.Short() {
		return 1_000
	}
	return 2_000
}

// openDSN opens a database by dsn with the driver's configuration changed
// by edit; the test closes it.
func openDSN(t testing.TB, dsn string, edit func(cfg *gomysql.Config)) *sql.DB {
	t.Helper()
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
