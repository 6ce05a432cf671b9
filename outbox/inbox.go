package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// InboxStore is implemented by store adapters that keep an inbox: a table
// of (consumer, tenant, message ID) already handled, written in the
// consumer's own transaction TTx.
type InboxStore[TTx any] interface {
	// InboxClaimTx records that consumer handles the message in tx. It
	// returns true the first time, false when a committed (or this same)
	// transaction already recorded it. A concurrent transaction recording the
	// same message waits for the first one to end. Adapters call p.Validate
	// before any statement, so bad params leave tx usable.
	InboxClaimTx(ctx context.Context, tx TTx, p InboxClaimParams) (bool, error)
	// InboxPrune deletes records older than Before, at most Limit, and
	// returns how many it deleted. Redeliveries older than the retention are
	// no longer recognised.
	InboxPrune(ctx context.Context, p InboxPruneParams) (int, error)
}

// InboxClaimParams names a delivered message for one consumer.
type InboxClaimParams struct {
	// Consumer names the handler (one inbox serves several).
	Consumer string
	Tenant   string
	// MessageID is the delivered message's ID (an outbox Message.ID, a
	// broker's message ID, an idempotency key).
	MessageID string
	Now       time.Time
}

// InboxPruneParams selects the inbox records to delete.
type InboxPruneParams struct {
	Before time.Time
	// Limit defaults to 1000.
	Limit int
}

// Inbox makes a consumer idempotent: the handler runs, in the consumer's
// transaction, only for the first delivery of a message; a redelivery (the
// at-least-once side of every broker and outbox) is acknowledged without
// running it again. Because the record is written in the same transaction
// as the handler's effects, a handler that fails and rolls back leaves no
// record, and the redelivery runs it again.
//
//	inbox := outbox.NewInbox(store)
//	err := store.InTx(ctx, func(tx *sql.Tx) error {
//		_, err := inbox.HandleTx(ctx, tx, "billing", msg.Tenant, msg.ID, func(ctx context.Context) error {
//			_, err := tx.ExecContext(ctx, `UPDATE accounts SET ...`)
//			return err
//		})
//		return err
//	})
type Inbox[TTx any] struct {
	store InboxStore[TTx]
	clock Clock
}

// NewInbox returns an Inbox over a store adapter.
func NewInbox[TTx any](store InboxStore[TTx]) *Inbox[TTx] {
	return &Inbox[TTx]{store: store, clock: SystemClock}
}

// HandleTx runs fn in tx unless consumer already handled (tenant,
// messageID) in a committed transaction. It reports whether fn ran. An
// error from fn is returned as is: roll tx back, and the message will be
// handled again on its next delivery.
func (i *Inbox[TTx]) HandleTx(ctx context.Context, tx TTx, consumer, tenant, messageID string, fn func(ctx context.Context) error) (bool, error) {
	p := InboxClaimParams{Consumer: consumer, Tenant: tenant, MessageID: messageID, Now: i.clock.Now()}
	// Checked here too (the store checks again, as it does for a direct
	// caller: the check is cheap), so no store sees bad names.
	if err := p.Validate(); err != nil {
		return false, err
	}
	first, err := i.store.InboxClaimTx(ctx, tx, p)
	if err != nil || !first {
		return false, err
	}
	return true, fn(ctx)
}

// Validate checks p's names: Consumer and MessageID are required, and every
// name is valid UTF-8 without NUL, at most MaxKeyLength bytes. Store
// adapters call it before any statement, so a bad claim leaves the
// caller's transaction usable.
func (p InboxClaimParams) Validate() error {
	for _, f := range []struct{ name, v string }{{"Consumer", p.Consumer}, {"Tenant", p.Tenant}, {"MessageID", p.MessageID}} {
		if len(f.v) > MaxKeyLength {
			return invalid(f.name, fmt.Sprintf("is %d bytes, the limit is %d", len(f.v), MaxKeyLength))
		}
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return invalid(f.name, "is not valid UTF-8 without NUL")
		}
	}
	if p.Consumer == "" {
		return invalid("Consumer", "is required")
	}
	if p.MessageID == "" {
		return invalid("MessageID", "is required")
	}
	return nil
}
