package whatsapp

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// resolvedChange is one change of a notification with the tenant its phone
// number ID resolved to.
type resolvedChange struct {
	tenant string
	pid    string
	value  *Value
}

// notify handles a POST: it checks the signature, then applies statuses and
// records inbound messages, answering 500 when something must be redelivered.
func (h *Webhook) notify(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	log := h.cfg.Logger
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	sig := r.Header.Get(SignatureHeader)
	if !h.cfg.InsecureSkipSignature {
		if sig == "" {
			log.WarnContext(ctx, "whatsapp: webhook refused: no signature")
			http.Error(w, "signature required", http.StatusUnauthorized)
			return
		}
		if !strings.HasPrefix(sig, "sha256=") || len(sig) != len("sha256=")+64 {
			log.WarnContext(ctx, "whatsapp: webhook refused: malformed signature")
			http.Error(w, "invalid signature", http.StatusUnauthorized)
			return
		}
	}
	n, err := ParseNotification(body)
	if err != nil {
		log.WarnContext(ctx, "whatsapp: webhook refused: malformed JSON", "bytes", len(body))
		http.Error(w, "malformed JSON", http.StatusBadRequest)
		return
	}

	// Resolve each change's tenant from its phone number ID.
	tenants := map[string]string{} // phone number ID -> tenant
	unknownPID := map[string]bool{}
	known := map[string]bool{}
	var changes []resolvedChange
	for i := range n.Entry {
		for j := range n.Entry[i].Changes {
			v := &n.Entry[i].Changes[j].Value
			pid := v.Metadata.PhoneNumberID
			if len(v.Statuses) == 0 && len(v.Messages) == 0 && len(v.Errors) == 0 {
				continue
			}
			if pid == "" {
				log.WarnContext(ctx, "whatsapp: webhook change without metadata.phone_number_id ignored", "field", n.Entry[i].Changes[j].Field)
				continue
			}
			if unknownPID[pid] {
				continue
			}
			t, seen := tenants[pid]
			if !seen {
				t, err = h.cfg.Credentials.TenantByPhoneNumberID(ctx, pid)
				switch {
				case errors.Is(err, ErrUnknownTenant):
					log.WarnContext(ctx, "whatsapp: webhook for an unknown phone number id ignored", "phone_number_id", pid)
					unknownPID[pid] = true
					continue
				case err != nil:
					log.ErrorContext(ctx, "whatsapp: resolving the tenant failed", "phone_number_id", pid, "err", err)
					http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
					return
				}
				tenants[pid] = t
				known[t] = true
			}
			changes = append(changes, resolvedChange{tenant: t, pid: pid, value: v})
		}
	}

	// Authenticate: the signature must verify with the app secret of every
	// tenant the notification touches.
	if !h.cfg.InsecureSkipSignature {
		checked := map[string]bool{}
		if len(known) == 0 && len(unknownPID) > 0 && h.cfg.AppSecret == "" {
			// Every phone number ID is unknown and there is no shared app
			// secret: the signature cannot be checked, so the notification
			// is not acknowledged as if it had been.
			log.WarnContext(ctx, "whatsapp: webhook refused: no phone number id of the notification is known, so its signature cannot be verified")
			http.Error(w, "unknown phone number id: the signature cannot be verified", http.StatusUnauthorized)
			return
		}
		if len(known) == 0 && h.cfg.AppSecret != "" {
			if VerifySignature(body, sig, h.cfg.AppSecret) != nil {
				http.Error(w, "invalid signature", http.StatusUnauthorized)
				return
			}
		}
		for t := range known {
			creds, err := h.cfg.Credentials.Credentials(ctx, t)
			if err != nil && !errors.Is(err, ErrUnknownTenant) {
				log.ErrorContext(ctx, "whatsapp: credentials provider failed", "tenant", t, "err", err)
				http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
				return
			}
			secret := cmp.Or(creds.AppSecret, h.cfg.AppSecret)
			if checked[secret] {
				continue
			}
			if err := VerifySignature(body, sig, secret); err != nil {
				log.WarnContext(ctx, "whatsapp: webhook refused: signature does not match the tenant's app secret", "tenant", t)
				http.Error(w, "invalid signature", http.StatusUnauthorized)
				return
			}
			checked[secret] = true
		}
	}
	if org := r.Header.Get("X-Org-Id"); org != "" {
		for t := range known {
			if t != org {
				log.WarnContext(ctx, "whatsapp: webhook refused: X-Org-Id disagrees with the phone number's tenant", "tenant", t)
				http.Error(w, "X-Org-Id does not match the notification's tenant", http.StatusForbidden)
				return
			}
		}
	}

	early := 0 // statuses that arrived before their send was recorded
	for _, c := range changes {
		for _, e := range c.value.Errors {
			log.WarnContext(ctx, "whatsapp: webhook reports an error", "tenant", c.tenant, "code", e.Code, "title", e.Title, "details", e.ErrorData.Details)
		}
		for i := range c.value.Statuses {
			later, err := h.applyStatus(ctx, c.tenant, &c.value.Statuses[i])
			if err != nil {
				log.ErrorContext(ctx, "whatsapp: applying a status failed; Meta will redeliver", "tenant", c.tenant, "wamid", c.value.Statuses[i].ID, "err", err)
				http.Error(w, "temporarily unavailable", http.StatusInternalServerError)
				return
			}
			if later {
				early++
			}
		}
		for i := range c.value.Messages {
			if err := h.inbound(ctx, c, i); err != nil {
				log.ErrorContext(ctx, "whatsapp: handling an inbound message failed; Meta will redeliver", "tenant", c.tenant, "wamid", c.value.Messages[i].ID, "err", err)
				http.Error(w, "temporarily unavailable", http.StatusInternalServerError)
				return
			}
		}
	}
	if early > 0 {
		// Everything else was applied; applying again is idempotent, so
		// Meta's redelivery of the whole notification only adds these.
		http.Error(w, "a message's send is not recorded yet; retry later", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func deliveryStatus(s string) (outbox.DeliveryStatus, bool) {
	switch s {
	case "sent":
		return outbox.DeliverySent, true
	case "delivered":
		return outbox.DeliveryDelivered, true
	case "read", "played":
		return outbox.DeliveryRead, true
	case "failed":
		return outbox.DeliveryFailed, true
	}
	return "", false
}

// maxCallbackData is the longest biz_opaque_callback_data Meta accepts.
const maxCallbackData = 512

// applyStatus applies one status. later is true when the status must be
// redelivered: its wamid is unknown, but its biz_opaque_callback_data names
// a message of the tenant whose send is in flight or not yet recorded.
func (h *Webhook) applyStatus(ctx context.Context, tenant string, s *StatusUpdate) (later bool, err error) {
	ds, ok := deliveryStatus(s.Status)
	if !ok || s.ID == "" {
		h.cfg.Logger.WarnContext(ctx, "whatsapp: status ignored", "tenant", tenant, "wamid", s.ID, "status", s.Status)
		return false, nil
	}
	rec := outbox.Receipt{Tenant: tenant, ProviderMessageID: s.ID, Status: ds, At: s.Timestamp.Time()}
	if rec.At.IsZero() {
		rec.At = h.cfg.Clock.Now()
	}
	if ds == outbox.DeliveryFailed {
		rec.Error = &outbox.ErrorInfo{Code: "delivery_failed", Message: "WhatsApp reported the delivery as failed"}
		if len(s.Errors) > 0 {
			e := s.Errors[0]
			msg := cmp.Or(e.Title, e.Message)
			if e.ErrorData.Details != "" {
				msg += " (" + e.ErrorData.Details + ")"
			}
			rec.Error = &outbox.ErrorInfo{Code: strconv.Itoa(e.Code), Message: msg}
		}
	}
	res, err := h.cfg.Receipts.MessageApplyReceipt(ctx, outbox.MessageApplyReceiptParams{Receipt: rec})
	found := true
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		inFlight, err := h.inFlight(ctx, tenant, s.BizOpaqueCallbackData)
		if err != nil {
			return false, err
		}
		if inFlight {
			h.cfg.Logger.InfoContext(ctx, "whatsapp: status arrived before its send was recorded; asking Meta to redeliver", "tenant", tenant, "wamid", s.ID, "message_id", s.BizOpaqueCallbackData, "status", s.Status)
			return true, nil
		}
		found = false
		h.cfg.Logger.InfoContext(ctx, "whatsapp: status for an unknown wamid acknowledged", "tenant", tenant, "wamid", s.ID, "status", s.Status)
	case err != nil:
		return false, err
	case res.Changed:
		h.cfg.Observer.OnDeliveryUpdated(ctx, outbox.DeliveryEvent{Message: res.Message, Previous: res.Previous, Receipt: rec})
	}
	if h.cfg.OnStatus != nil {
		h.cfg.OnStatus(ctx, StatusEvent{Tenant: tenant, Status: *s, Receipt: rec, Found: found, Result: res})
	}
	return false, nil
}

// inFlight reports whether id (a status's biz_opaque_callback_data: the
// outbox message ID the publisher sent) names a message of tenant that is
// PENDING or PROCESSING: its send may have happened without its outcome
// being recorded yet. The lookup is scoped by tenant, so a payload can
// never reach another tenant's message.
func (h *Webhook) inFlight(ctx context.Context, tenant, id string) (bool, error) {
	if id == "" || len(id) > maxCallbackData {
		return false, nil
	}
	m, err := h.cfg.Receipts.MessageGet(ctx, outbox.MessageGetParams{Tenant: tenant, ID: id})
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return m.Tenant == tenant && (m.Status == outbox.StatusPending || m.Status == outbox.StatusProcessing), nil
}

func (h *Webhook) inbound(ctx context.Context, c resolvedChange, i int) error {
	wm := &c.value.Messages[i]
	if wm.ID == "" {
		return nil
	}
	now := h.cfg.Clock.Now()
	at := wm.Timestamp.Time()
	if at.IsZero() || at.After(now.Add(5*time.Minute)) {
		at = now
	}
	m := InboundMessage{
		Tenant: c.tenant, PhoneNumberID: c.pid, ID: wm.ID, From: wm.From, UserID: wm.UserID,
		Type: wm.Type, Timestamp: at,
	}
	if wm.Text != nil {
		m.Text = wm.Text.Body
	}
	if phone, err := NormalizePhone(wm.From); err == nil {
		m.Phone = phone
	}
	for _, ct := range c.value.Contacts {
		if (ct.WaID != "" && ct.WaID == wm.From) || (ct.UserID != "" && ct.UserID == wm.UserID) || len(c.value.Contacts) == 1 {
			m.ContactName = ct.Profile.Name
			break
		}
	}
	if m.Phone != "" && h.cfg.Windows != nil {
		if err := h.cfg.Windows.WindowTouch(ctx, c.tenant, m.Phone, at); err != nil {
			return err
		}
	}
	if h.cfg.OnInbound == nil {
		return nil
	}
	first, err := h.cfg.Dedup.InboundClaim(ctx, c.tenant, wm.ID, now)
	if err != nil {
		return err
	}
	if !first {
		h.cfg.Logger.DebugContext(ctx, "whatsapp: duplicate inbound message skipped", "tenant", c.tenant, "wamid", wm.ID)
		return nil
	}
	m.Raw = wm.Raw
	if err := h.cfg.OnInbound(ctx, m); err != nil {
		if rerr := h.cfg.Dedup.InboundRelease(ctx, c.tenant, wm.ID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	}
	return nil
}
