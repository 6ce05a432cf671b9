package outbox

import (
	"errors"
	"testing"
	"time"
)

func TestApplyReceipt(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	sent := Message{ID: "m", Status: StatusSent, SentAt: t0}
	r := func(d DeliveryStatus, at time.Duration) Receipt {
		return Receipt{ProviderMessageID: "wamid.1", Status: d, At: t0.Add(at)}
	}

	// delivered then a late "sent": stays DELIVERED
	m, changed, err := ApplyReceipt(sent, r(DeliveryDelivered, time.Minute))
	if err != nil || !changed || m.Status != StatusDelivered || !m.DeliveredAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("delivered: %+v %v %v", m, changed, err)
	}
	m2, changed, _ := ApplyReceipt(m, r(DeliverySent, 30*time.Second))
	if changed || m2.Status != StatusDelivered {
		t.Fatalf("late sent receipt changed a delivered message: %+v", m2)
	}
	// repeated delivered: no change
	if _, changed, _ = ApplyReceipt(m, r(DeliveryDelivered, 2*time.Minute)); changed {
		t.Fatal("repeated delivered receipt reported a change")
	}
	// read keeps DELIVERED, sets ReadAt once
	m3, changed, _ := ApplyReceipt(m, r(DeliveryRead, 3*time.Minute))
	if !changed || m3.Status != StatusDelivered || !m3.ReadAt.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("read: %+v", m3)
	}
	if _, changed, _ = ApplyReceipt(m3, r(DeliveryRead, 4*time.Minute)); changed {
		t.Fatal("repeated read changed the message")
	}
	// read before delivered (out of order): DELIVERED with both times
	m4, _, _ := ApplyReceipt(sent, r(DeliveryRead, time.Minute))
	if m4.Status != StatusDelivered || m4.DeliveredAt.IsZero() || m4.ReadAt.IsZero() {
		t.Fatalf("read first: %+v", m4)
	}
	// failed after delivered is ignored
	if m5, changed, _ := ApplyReceipt(m3, r(DeliveryFailed, 5*time.Minute)); changed || m5.Status != StatusDelivered {
		t.Fatalf("failed after delivered: %+v", m5)
	}
	// failed from SENT records the error
	fr := r(DeliveryFailed, time.Minute)
	fr.Error = &ErrorInfo{Code: "131026", Message: "undeliverable"}
	m6, changed, _ := ApplyReceipt(sent, fr)
	if !changed || m6.Status != StatusFailed || m6.LastError == nil || m6.LastError.Code != "131026" {
		t.Fatalf("failed: %+v", m6)
	}
	// receipts never touch terminal or not-yet-sent messages
	for _, s := range []Status{StatusPending, StatusProcessing, StatusCancelled, StatusFailed} {
		for _, d := range []DeliveryStatus{DeliverySent, DeliveryDelivered, DeliveryRead, DeliveryFailed} {
			in := Message{Status: s}
			if out, changed, err := ApplyReceipt(in, r(d, 0)); changed || err != nil || out.Status != s {
				t.Errorf("%s + %s: %s changed=%v err=%v", s, d, out.Status, changed, err)
			}
		}
	}
	if _, _, err := ApplyReceipt(sent, Receipt{Status: "bogus"}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("unknown delivery status: %v", err)
	}
}
