package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
)

type enqueueObserver struct {
	outbox.NopObserver
	enqueued []outbox.EnqueuedEvent
	blocked  []outbox.BlockedEvent
}

func (o *enqueueObserver) OnEnqueued(_ context.Context, e outbox.EnqueuedEvent) {
	o.enqueued = append(o.enqueued, e)
}

func (o *enqueueObserver) OnBlockedByPolicy(_ context.Context, e outbox.BlockedEvent) {
	o.blocked = append(o.blocked, e)
}

func TestOutboxPolicyValidationAndObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	obs := &enqueueObserver{}
	consent := outbox.PolicyFunc(func(_ context.Context, m *outbox.Message) error {
		if m.Headers["consent"] != "yes" {
			return &outbox.PolicyError{Code: "consent_required", Reason: "no consent for this channel"}
		}
		return nil
	})
	ob := outbox.New[*sql.Tx](st, outbox.Options{Policy: consent, Observer: obs})

	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok := outbox.Message{Tenant: "org-1", Topic: "whatsapp", Payload: []byte(`{}`), Headers: map[string]string{"consent": "yes"}}
	refused := outbox.Message{Tenant: "org-1", Topic: "whatsapp", Payload: []byte(`{}`)}

	// A refusal anywhere in the call inserts nothing and says which message.
	_, err = ob.EnqueueTx(ctx, tx, ok, refused)
	var pe *outbox.PolicyError
	if !errors.Is(err, outbox.ErrBlockedByPolicy) || !errors.As(err, &pe) || pe.Index != 1 || pe.Code != "consent_required" {
		t.Fatalf("want a PolicyError for message 1, got %v", err)
	}
	if len(obs.blocked) != 1 || obs.blocked[0].Message.Tenant != "org-1" {
		t.Fatalf("OnBlockedByPolicy: %+v", obs.blocked)
	}
	// Invalid input is refused before any SQL: the transaction stays usable.
	_, err = ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "whatsapp", Payload: []byte(`{not json`), Headers: map[string]string{"consent": "yes"}})
	if !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("want ErrInvalidInput, got %v", err)
	}
	res, err := ob.EnqueueTx(ctx, tx, ok)
	if err != nil || len(res) != 1 || res[0].Existed {
		t.Fatalf("enqueue after refusals: %+v %v", res, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c := counts(t, st)
	if c[outbox.StatusPending] != 0 { // counts are per tenant; "" has none
		t.Fatalf("tenant '' counts %v", c)
	}
	c, _ = st.MessageCount(ctx, outbox.MessageCountParams{Tenant: "org-1"})
	if c[outbox.StatusPending] != 1 {
		t.Fatalf("org-1 counts %v, want exactly the one accepted message", c)
	}
	if len(obs.enqueued) != 1 || obs.enqueued[0].Message.ID != res[0].Message.ID {
		t.Fatalf("OnEnqueued: %+v", obs.enqueued)
	}
	// The caller's message is not modified by Enqueue.
	if ok.ID != "" || ok.Status != "" {
		t.Fatalf("Enqueue modified the caller's message: %+v", ok)
	}
}
