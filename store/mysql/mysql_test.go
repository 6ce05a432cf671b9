package mysql_test

import (
	"context"
	"database/sql"
	"testing"

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
			return storetest.Backend[*sql.Tx]{
				Store:    st,
				Enqueuer: st,
				Inbox:    st,
				Begin: func(ctx context.Context) (*sql.Tx, error) {
					return st.DB().BeginTx(ctx, nil)
				},
				Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
				Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
				Usable: func(ctx context.Context, tx *sql.Tx) error {
					var one int
					return tx.QueryRowContext(ctx, "SELECT 1").Scan(&one)
				},
			}
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
