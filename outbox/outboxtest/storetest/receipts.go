package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

// sentMessage enqueues a message for tenant, claims it and records it SENT
// with provider ID pid at t0.
func (e *env[TTx]) sentMessage(tenant, pid string) outbox.Message {
	e.t.Helper()
	m := e.enqueue(outbox.Message{Tenant: tenant, Topic: "whatsapp", Payload: []byte(`{}`)})[0]
	got := e.claimP(outbox.MessageClaimParams{Limit: 1, Owner: "p", Now: e.t0})
	wantIDs(e.t, "claim", got, m)
	e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: 1, ClaimToken: got[0].ClaimToken, ProviderMessageID: pid}}})
	return e.wantStatus(tenant, m.ID, outbox.StatusSent)
}

func (e *env[TTx]) receipt(r outbox.Receipt) outbox.ReceiptResult {
	e.t.Helper()
	res, err := e.s.MessageApplyReceipt(e.ctx, outbox.MessageApplyReceiptParams{Receipt: r})
	require.NoError(e.t, err, "MessageApplyReceipt(%+v)", r)
	return res
}

func testReceipts[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("InOrderAndRepeated", func(t *testing.T) {
		need(t, h, CapReceipts, CapTenants)
		e := setup(t, h)
		m := e.sentMessage("a", "wamid.1")
		res := e.receipt(outbox.Receipt{Tenant: "a", ProviderMessageID: "wamid.1", Status: outbox.DeliveryDelivered, At: e.at(time.Minute)})
		if !res.Changed || res.Previous != outbox.StatusSent || res.Message.Status != outbox.StatusDelivered || res.Message.ID != m.ID {
			t.Fatalf("delivered receipt: %+v", res)
		}
		got := e.wantStatus("a", m.ID, outbox.StatusDelivered)
		wantTime(t, "DeliveredAt", got.DeliveredAt, e.at(time.Minute))

		res = e.receipt(outbox.Receipt{Tenant: "a", ProviderMessageID: "wamid.1", Status: outbox.DeliveryDelivered, At: e.at(2 * time.Minute)})
		if res.Changed {
			t.Fatalf("a repeated delivered receipt changed the message: %+v", res)
		}
		wantTime(t, "DeliveredAt after a repeat", e.get("a", m.ID).DeliveredAt, e.at(time.Minute))

		res = e.receipt(outbox.Receipt{Tenant: "a", ProviderMessageID: "wamid.1", Status: outbox.DeliveryRead, At: e.at(3 * time.Minute)})
		if !res.Changed || res.Message.Status != outbox.StatusDelivered {
			t.Fatalf("read receipt: %+v; want changed and DELIVERED", res)
		}
		got = e.wantStatus("a", m.ID, outbox.StatusDelivered)
		wantTime(t, "ReadAt", got.ReadAt, e.at(3*time.Minute))
		wantTime(t, "DeliveredAt after read", got.DeliveredAt, e.at(time.Minute))
	})

	t.Run("OutOfOrderNeverMovesBack", func(t *testing.T) {
		need(t, h, CapReceipts)
		e := setup(t, h)
		m := e.sentMessage("", "wamid.2")
		// read arrives first: DELIVERED with both times.
		e.receipt(outbox.Receipt{ProviderMessageID: "wamid.2", Status: outbox.DeliveryRead, At: e.at(2 * time.Minute)})
		got := e.wantStatus("", m.ID, outbox.StatusDelivered)
		wantTime(t, "ReadAt", got.ReadAt, e.at(2*time.Minute))
		if got.DeliveredAt.IsZero() {
			t.Fatal("a read receipt left DeliveredAt empty")
		}
		// late sent and delivered: no step back.
		e.receipt(outbox.Receipt{ProviderMessageID: "wamid.2", Status: outbox.DeliverySent, At: e.at(time.Minute)})
		e.receipt(outbox.Receipt{ProviderMessageID: "wamid.2", Status: outbox.DeliveryDelivered, At: e.at(time.Minute)})
		e.wantStatus("", m.ID, outbox.StatusDelivered)
		// failed after delivered is ignored.
		res := e.receipt(outbox.Receipt{ProviderMessageID: "wamid.2", Status: outbox.DeliveryFailed, At: e.at(3 * time.Minute),
			Error: &outbox.ErrorInfo{Code: "131026", Message: "undeliverable"}})
		if res.Changed {
			t.Fatalf("failed after delivered changed the message: %+v", res)
		}
		if got := e.wantStatus("", m.ID, outbox.StatusDelivered); got.LastError != nil {
			t.Fatalf("failed after delivered set LastError %+v", got.LastError)
		}
	})

	t.Run("FailedAfterSent", func(t *testing.T) {
		need(t, h, CapReceipts)
		e := setup(t, h)
		m := e.sentMessage("", "wamid.3")
		res := e.receipt(outbox.Receipt{ProviderMessageID: "wamid.3", Status: outbox.DeliveryFailed, At: e.at(time.Minute),
			Error: &outbox.ErrorInfo{Code: "131026", Message: "undeliverable"}})
		if !res.Changed || res.Previous != outbox.StatusSent {
			t.Fatalf("failed receipt: %+v", res)
		}
		got := e.wantStatus("", m.ID, outbox.StatusFailed)
		if got.LastError == nil || got.LastError.Code != "131026" {
			t.Fatalf("LastError %+v, want code 131026", got.LastError)
		}
		res = e.receipt(outbox.Receipt{ProviderMessageID: "wamid.3", Status: outbox.DeliveryDelivered, At: e.at(2 * time.Minute)})
		if res.Changed {
			t.Fatal("a delivered receipt revived a FAILED message")
		}
		e.wantStatus("", m.ID, outbox.StatusFailed)
	})

	t.Run("UnknownAndOtherTenant", func(t *testing.T) {
		need(t, h, CapReceipts, CapTenants)
		e := setup(t, h)
		m := e.sentMessage("a", "wamid.4")
		_, err := e.s.MessageApplyReceipt(e.ctx, outbox.MessageApplyReceiptParams{Receipt: outbox.Receipt{
			Tenant: "a", ProviderMessageID: "wamid.unknown", Status: outbox.DeliveryDelivered, At: e.t0}})
		wantErrIs(t, "receipt for an unknown provider ID", err, outbox.ErrNotFound)
		_, err = e.s.MessageApplyReceipt(e.ctx, outbox.MessageApplyReceiptParams{Receipt: outbox.Receipt{
			Tenant: "b", ProviderMessageID: "wamid.4", Status: outbox.DeliveryFailed, At: e.t0}})
		wantErrIs(t, "receipt from another tenant", err, outbox.ErrNotFound)
		got := e.wantStatus("a", m.ID, outbox.StatusSent)
		if got.LastError != nil || !sameTime(got.UpdatedAt, m.UpdatedAt) {
			t.Fatalf("another tenant's receipt touched the message: %+v", got)
		}
		_, err = e.s.MessageApplyReceipt(e.ctx, outbox.MessageApplyReceiptParams{Receipt: outbox.Receipt{
			Tenant: "a", ProviderMessageID: "wamid.4", Status: "bounced", At: e.t0}})
		wantErrIs(t, "receipt with an unknown status", err, outbox.ErrInvalidInput)
		e.wantStatus("a", m.ID, outbox.StatusSent)
	})
}
