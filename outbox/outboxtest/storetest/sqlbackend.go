package storetest

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/outbox"
)

// SQLStore is a database/sql store: its caller's transactions are *sql.Tx
// begun on DB.
type SQLStore interface {
	outbox.Store
	outbox.Enqueuer[*sql.Tx]
	outbox.InboxStore[*sql.Tx]
	DB() *sql.DB
}

// SQLBackend is the Backend of a fresh, migrated database/sql store: the
// caller's transactions begin on st.DB() with the database's default
// options, and a transaction is usable when it answers SELECT 1.
func SQLBackend(st SQLStore) Backend[*sql.Tx] {
	return Backend[*sql.Tx]{
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
}
