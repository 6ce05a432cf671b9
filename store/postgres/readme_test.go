package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
)

// The README's inbox snippet and outboxtest.RequireEnqueuedTx, on
// PostgreSQL: InTx gives a pgx.Tx, the inbox and MessageListTx take it.
func TestReadmeInboxAndRequireEnqueuedTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	if _, err := b.pg.Pool.Exec(ctx, `CREATE TABLE `+b.pg.Name+`.accounts (id int PRIMARY KEY, balance int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pg.Pool.Exec(ctx, `INSERT INTO `+b.pg.Name+`.accounts VALUES (7, 0)`); err != nil {
		t.Fatal(err)
	}
	inbox := outbox.NewInbox(b.store)
	msg := outbox.Message{ID: outbox.NewID(time.Now()), Tenant: "acme"}
	handle := func() error {
		return b.store.InTx(ctx, func(tx pgx.Tx) error {
			_, err := inbox.HandleTx(ctx, tx, "billing", msg.Tenant, msg.ID, func(ctx context.Context) error {
				_, err := tx.Exec(ctx, `UPDATE `+b.pg.Name+`.accounts SET balance = balance + $1 WHERE id = $2`, 10, 7)
				return err
			})
			return err
		})
	}
	for range 2 { // a redelivery runs the handler once
		if err := handle(); err != nil {
			t.Fatal(err)
		}
	}
	var balance int
	if err := b.pg.Pool.QueryRow(ctx, `SELECT balance FROM `+b.pg.Name+`.accounts WHERE id = 7`).Scan(&balance); err != nil || balance != 10 {
		t.Fatalf("balance = %d, %v; want 10 (handled once)", balance, err)
	}

	err := b.store.InTx(ctx, func(tx pgx.Tx) error {
		if _, err := b.ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Payload: []byte(`{"id": 1}`)}); err != nil {
			return err
		}
		outboxtest.RequireEnqueuedTx(t, b.store, tx, outboxtest.Want{Topic: "orders", Payload: []byte(`{"id":1}`), Count: 1})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
