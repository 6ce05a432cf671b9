package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// A consumer credits an account once per message, however many times the
// broker delivers it: the inbox record and the credit commit together, so a
// failed attempt leaves neither and the redelivery runs the handler again.
func ExampleInbox_HandleTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-inbox-example-")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	_, _ = store.DB().ExecContext(ctx, `CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)`)
	_, _ = store.DB().ExecContext(ctx, `INSERT INTO accounts VALUES ('alice', 0)`)

	inbox := outbox.NewInbox[*sql.Tx](store)
	errFlaky := errors.New("downstream unavailable")
	// deliver handles one delivery of the message in its own transaction.
	deliver := func(messageID string, fail bool) {
		var ran bool
		err := store.InTx(ctx, func(tx *sql.Tx) error {
			var err error
			ran, err = inbox.HandleTx(ctx, tx, "billing", "", messageID, func(ctx context.Context) error {
				if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + 10 WHERE id = 'alice'`); err != nil {
					return err
				}
				if fail {
					return errFlaky // rolled back with the credit and the inbox record
				}
				return nil
			})
			return err
		})
		fmt.Printf("delivery of %s: handled %v, err %v\n", messageID, ran && err == nil, err)
	}
	deliver("msg-1", true)  // fails: rolled back
	deliver("msg-1", false) // the redelivery runs it
	deliver("msg-1", false) // a duplicate: skipped
	deliver("msg-2", false)

	var balance int
	_ = store.DB().QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 'alice'`).Scan(&balance)
	fmt.Println("balance:", balance)

	// Forget records older than the retention (here: all of them).
	n, err := store.InboxPrune(ctx, outbox.InboxPruneParams{Before: time.Now().Add(time.Minute)})
	fmt.Println("pruned:", n, err)
	// Output:
	// delivery of msg-1: handled false, err downstream unavailable
	// delivery of msg-1: handled true, err <nil>
	// delivery of msg-1: handled false, err <nil>
	// delivery of msg-2: handled true, err <nil>
	// balance: 20
	// pruned: 2 <nil>
}
