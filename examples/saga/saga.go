package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outboxkit/outboxkit/outbox"
)

// The order service's tables (orders.db, beside the outbox).
const orderSchema = `
CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, sku TEXT NOT NULL, amount INTEGER NOT NULL, status TEXT NOT NULL);
CREATE TABLE stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL);
CREATE TABLE stock_reservations (order_id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL);
CREATE TABLE wallets (customer TEXT PRIMARY KEY, balance INTEGER NOT NULL);
CREATE TABLE payments (order_id TEXT PRIMARY KEY, amount INTEGER NOT NULL);
CREATE TABLE sagas (order_id TEXT PRIMARY KEY, state TEXT NOT NULL, failed_step TEXT, reason TEXT);
INSERT INTO stock VALUES ('book', 10);
INSERT INTO wallets VALUES ('ada', 100), ('bob', 5);
`

// Saga states, as the sagas table records them.
const (
	SagaCompleted    = "COMPLETED"
	SagaCompensating = "COMPENSATING"
)

// Topics of the saga's events.
const (
	TopicOrders  = "orders"  // the order's events, FIFO per order (group = order ID)
	TopicLoyalty = "loyalty" // loyalty points, POSTed to the loyalty service
)

// Order is the input of a saga.
type Order struct {
	ID       string
	Customer string
	SKU      string
	Amount   int
	// Loyalty asks for loyalty points once the order completes.
	Loyalty bool
}

// Event is the payload of every saga event.
type Event struct {
	Order string `json:"order"`
	Type  string `json:"type"`
	// Step numbers the order's events: the consumer checks it applies them
	// in this order.
	Step int `json:"step"`
}

// step is one action of the saga: it writes its business rows in the
// saga's transaction and names the event announcing it, and the event that
// undoes it if a later step fails.
type step struct {
	name         string
	event        string
	compensation string
	action       func(ctx context.Context, tx *sql.Tx, o Order) error
}

// errDeclined is a business failure: the saga compensates.
type errDeclined struct{ reason string }

func (e errDeclined) Error() string { return e.reason }

var steps = []step{
	{name: "create order", event: "OrderCreated", compensation: "OrderCancelled",
		action: func(ctx context.Context, tx *sql.Tx, o Order) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?, ?, ?, ?, 'CREATED')`, o.ID, o.Customer, o.SKU, o.Amount)
			return err
		}},
	{name: "reserve stock", event: "StockReserved", compensation: "StockReleased",
		action: func(ctx context.Context, tx *sql.Tx, o Order) error {
			res, err := tx.ExecContext(ctx, `UPDATE stock SET available = available - 1 WHERE sku = ? AND available > 0`, o.SKU)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return errDeclined{"out of stock"}
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO stock_reservations VALUES (?, ?, 1)`, o.ID, o.SKU)
			return err
		}},
	{name: "charge payment", event: "PaymentCharged", compensation: "PaymentRefunded",
		action: func(ctx context.Context, tx *sql.Tx, o Order) error {
			res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance - ? WHERE customer = ? AND balance >= ?`, o.Amount, o.Customer, o.Amount)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return errDeclined{"payment declined: insufficient funds"}
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO payments VALUES (?, ?)`, o.ID, o.Amount)
			return err
		}},
}

// undo reverses a completed step's rows when the saga compensates.
var undo = map[string]string{
	"reserve stock": `UPDATE stock SET available = available + 1 WHERE sku = (SELECT sku FROM stock_reservations WHERE order_id = ?1);
		DELETE FROM stock_reservations WHERE order_id = ?1`,
	"create order": `UPDATE orders SET status = 'CANCELLED' WHERE id = ?1`,
}

// executeSaga runs the saga of o in ONE transaction: each step writes its
// business rows and its event is enqueued in the outbox beside them. When a
// step fails for a business reason, the same transaction undoes the
// completed steps' rows, records the saga as COMPENSATING and enqueues the
// compensation events (in reverse order); any other error rolls everything
// back. It returns the saga's state, the failed step's reason and the
// enqueued messages' IDs.
func executeSaga(ctx context.Context, db interface {
	InTx(ctx context.Context, fn func(tx *sql.Tx) error) error
}, ob *outbox.Outbox[*sql.Tx], o Order) (state, reason string, ids []string, err error) {
	err = db.InTx(ctx, func(tx *sql.Tx) error {
		var msgs []outbox.Message
		add := func(topic, typ string) {
			payload, _ := json.Marshal(Event{Order: o.ID, Type: typ, Step: len(msgs) + 1})
			msgs = append(msgs, outbox.Message{Topic: topic, Group: o.ID, Payload: payload, Headers: map[string]string{"event-type": typ}})
		}
		state, reason = SagaCompleted, ""
		failed := ""
		var done []step
		for _, s := range steps {
			err := s.action(ctx, tx, o)
			var d errDeclined
			if errors.As(err, &d) {
				state, reason, failed = SagaCompensating, d.reason, s.name
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			done = append(done, s)
			add(TopicOrders, s.event)
		}
		if state == SagaCompensating {
			for i := len(done) - 1; i >= 0; i-- {
				if q, ok := undo[done[i].name]; ok {
					if _, err := tx.ExecContext(ctx, q, o.ID); err != nil {
						return err
					}
				}
				add(TopicOrders, done[i].compensation)
			}
		} else if o.Loyalty {
			add(TopicLoyalty, "LoyaltyPointsAwarded")
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sagas VALUES (?, ?, NULLIF(?, ''), NULLIF(?, ''))`, o.ID, state, failed, reason); err != nil {
			return err
		}
		enq, err := ob.EnqueueTx(ctx, tx, msgs...)
		ids = ids[:0]
		for _, e := range enq {
			ids = append(ids, e.Message.ID)
		}
		return err
	})
	return state, reason, ids, err
}

// The order-history service's tables (history.db, beside its inbox): a
// projection of the order events.
const historySchema = `
CREATE TABLE order_view (order_id TEXT PRIMARY KEY, status TEXT NOT NULL, events INTEGER NOT NULL);
CREATE TABLE applied (n INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL, order_id TEXT NOT NULL, type TEXT NOT NULL, step INTEGER NOT NULL);
`

// viewStatus is the projection's status after an event.
var viewStatus = map[string]string{
	"OrderCreated": "CREATED", "StockReserved": "RESERVED", "PaymentCharged": "PAID",
	"PaymentRefunded": "REFUNDED", "StockReleased": "RELEASED", "OrderCancelled": "CANCELLED",
}

// apply applies one order event to the projection in the consumer's
// transaction. It refuses an event that arrives out of order (a bug the
// outbox's FIFO per group must prevent).
func apply(ctx context.Context, tx *sql.Tx, messageID string, payload []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(payload, &ev); err != nil || ev.Order == "" {
		return ev, fmt.Errorf("not an order event: %s", payload)
	}
	var last int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(step), 0) FROM applied WHERE order_id = ?`, ev.Order).Scan(&last); err != nil {
		return ev, err
	}
	if ev.Step != last+1 {
		return ev, fmt.Errorf("order %s: event %s is step %d, expected step %d", ev.Order, ev.Type, ev.Step, last+1)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO applied (message_id, order_id, type, step) VALUES (?, ?, ?, ?)`, messageID, ev.Order, ev.Type, ev.Step); err != nil {
		return ev, err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO order_view VALUES (?1, ?2, 1) ON CONFLICT (order_id) DO UPDATE SET status = ?2, events = events + 1`, ev.Order, viewStatus[ev.Type])
	return ev, err
}
