package whatsapp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultMaxBodyBytes is the largest webhook body accepted: Meta sends up to
// 3 MB.
const DefaultMaxBodyBytes = 3 << 20

// SignatureHeader is the header carrying the webhook signature.
const SignatureHeader = "X-Hub-Signature-256"

// Signature errors returned by VerifySignature.
var (
	// ErrSignatureMissing: the request has no X-Hub-Signature-256.
	ErrSignatureMissing = errors.New("whatsapp: webhook signature missing")
	// ErrSignatureInvalid: the signature is malformed or does not match.
	ErrSignatureInvalid = errors.New("whatsapp: webhook signature invalid")
)

// Sign returns the X-Hub-Signature-256 value of body for appSecret:
// "sha256=" and the lowercase hex HMAC-SHA256.
func Sign(body []byte, appSecret string) string {
	m := hmac.New(sha256.New, []byte(appSecret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// VerifySignature checks header (the X-Hub-Signature-256 value) against the
// HMAC-SHA256 of the raw body bytes keyed with appSecret, in constant time.
// It returns ErrSignatureMissing for an empty header and
// ErrSignatureInvalid for a malformed or wrong one or an empty secret.
func VerifySignature(body []byte, header, appSecret string) error {
	if header == "" {
		return ErrSignatureMissing
	}
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok || len(hexSig) != sha256.Size*2 || appSecret == "" {
		return ErrSignatureInvalid
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return ErrSignatureInvalid
	}
	m := hmac.New(sha256.New, []byte(appSecret))
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return ErrSignatureInvalid
	}
	return nil
}

// Notification is a webhook POST body.
type Notification struct {
	Object string  `json:"object"`
	Entry  []Entry `json:"entry"`
}

// Entry is one WhatsApp Business Account's part of a Notification.
type Entry struct {
	ID      string   `json:"id"`
	Changes []Change `json:"changes"`
}

// Change is one change of an Entry; Field "messages" carries statuses and
// inbound messages.
type Change struct {
	Field string `json:"field"`
	Value Value  `json:"value"`
}

// Value is the content of a Change.
type Value struct {
	MessagingProduct string `json:"messaging_product"`
	Metadata         struct {
		DisplayPhoneNumber string `json:"display_phone_number"`
		PhoneNumberID      string `json:"phone_number_id"`
	} `json:"metadata"`
	Contacts []Contact      `json:"contacts"`
	Messages []InboundWire  `json:"messages"`
	Statuses []StatusUpdate `json:"statuses"`
	Errors   []APIError     `json:"errors"`
}

// Contact is a sender's profile in an inbound notification.
type Contact struct {
	Profile struct {
		Name string `json:"name"`
	} `json:"profile"`
	WaID   string `json:"wa_id"`
	UserID string `json:"user_id"`
}

// Timestamp is a webhook time: Unix seconds, sent as a string (a number is
// accepted too).
type Timestamp int64

// UnmarshalJSON accepts "1739321024" and 1739321024; anything else is 0.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		*t = 0
		return nil
	}
	*t = Timestamp(n)
	return nil
}

// Time returns t as a time, or the zero time for 0.
func (t Timestamp) Time() time.Time {
	if t <= 0 {
		return time.Time{}
	}
	return time.Unix(int64(t), 0).UTC()
}

// StatusUpdate is one delivery status of a sent message.
type StatusUpdate struct {
	// ID is the wamid the send returned.
	ID string `json:"id"`
	// Status is sent, delivered, read, failed or played.
	Status                string     `json:"status"`
	Timestamp             Timestamp  `json:"timestamp"`
	RecipientID           string     `json:"recipient_id"`
	BizOpaqueCallbackData string     `json:"biz_opaque_callback_data,omitempty"`
	Errors                []APIError `json:"errors,omitempty"`
	Conversation          *struct {
		ID     string `json:"id"`
		Origin struct {
			Type string `json:"type"`
		} `json:"origin"`
		ExpirationTimestamp Timestamp `json:"expiration_timestamp,omitempty"`
	} `json:"conversation,omitempty"`
	Pricing *struct {
		Billable     bool   `json:"billable"`
		PricingModel string `json:"pricing_model"`
		Type         string `json:"type"`
		Category     string `json:"category"`
	} `json:"pricing,omitempty"`
}

// InboundWire is an inbound message as Meta sends it.
type InboundWire struct {
	From      string    `json:"from"`
	UserID    string    `json:"user_id,omitempty"`
	ID        string    `json:"id"`
	Timestamp Timestamp `json:"timestamp"`
	Type      string    `json:"type"`
	Text      *struct {
		Body string `json:"body"`
	} `json:"text,omitempty"`
	// Raw is the message object as received (media, location, interactive
	// replies... are there).
	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes the known fields and keeps the raw object.
func (m *InboundWire) UnmarshalJSON(b []byte) error {
	type plain InboundWire
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*m = InboundWire(p)
	m.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// ParseNotification decodes a webhook body. It returns an error for
// anything that is not a JSON object of the notification's shape.
func ParseNotification(body []byte) (*Notification, error) {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' {
		return nil, errors.New("whatsapp: webhook body is not a JSON object")
	}
	var n Notification
	if err := json.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("whatsapp: webhook body: %w", err)
	}
	return &n, nil
}

// ReceiptApplier applies delivery receipts and looks messages up; every
// outbox.Store is one.
type ReceiptApplier interface {
	// MessageApplyReceipt applies a receipt by provider message ID within
	// the receipt's tenant, or returns outbox.ErrNotFound.
	MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error)
	// MessageGet returns a message by ID within a tenant, or
	// outbox.ErrNotFound. The webhook uses it to tell a receipt that
	// arrived before its send was recorded (the message is still PENDING
	// or PROCESSING) from one for a message it does not know.
	MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error)
}

// InboundMessage is a message a user sent to a tenant's business number.
type InboundMessage struct {
	Tenant        string
	PhoneNumberID string
	// ID is the inbound message's wamid.
	ID string
	// From is the sender's number as Meta sends it (digits, no "+"); it may
	// be empty for a user known only by UserID.
	From string
	// Phone is From normalised ("+" and digits), or "".
	Phone string
	// UserID is the business-scoped user ID, when Meta sends one.
	UserID      string
	ContactName string
	Type        string
	// Text is the body of a text message.
	Text      string
	Timestamp time.Time
	// Raw is the message object as received.
	Raw json.RawMessage
}

// StatusEvent is one status of a webhook with everything Meta sent about
// it (pricing, conversation, errors), after it was applied.
type StatusEvent struct {
	Tenant string
	Status StatusUpdate
	// Receipt is what was applied to the store.
	Receipt outbox.Receipt
	// Found is false when no message of the tenant has the wamid.
	Found bool
	// Result is the store's answer (when Found).
	Result outbox.ReceiptResult
}

// WebhookConfig configures a Webhook.
type WebhookConfig struct {
	// Credentials resolves tenants from phone number IDs and gives their app
	// secret and verify token. Required.
	Credentials CredentialsProvider
	// Receipts applies delivery statuses: the outbox.Store. Required.
	// A status whose wamid is unknown but whose biz_opaque_callback_data
	// names a message of the tenant that is still PENDING or PROCESSING
	// (the send is in flight, or its outcome not yet recorded) answers 503
	// so that Meta redelivers it later.
	Receipts ReceiptApplier
	// AppSecret keys the signature of tenants whose Credentials.AppSecret is
	// empty (one Meta app serving every tenant).
	AppSecret string
	// InsecureSkipSignature accepts unsigned or wrongly signed POSTs. For
	// local development only: anyone could then forge receipts.
	InsecureSkipSignature bool
	// Windows, when set, is refreshed by every inbound message.
	Windows WindowStore
	// Dedup remembers inbound message IDs so OnInbound runs once per
	// message. Defaults to an in-memory Deduper (per process, lost on
	// restart); use the same State as the publisher to share it.
	Dedup Deduper
	// OnInbound receives each inbound message once. An error answers 500 so
	// that Meta redelivers the notification, and the message is offered
	// again.
	OnInbound func(ctx context.Context, m InboundMessage) error
	// OnStatus, when set, sees every status after it was applied, with
	// WhatsApp's details (pricing, conversation, errors). It must not block.
	OnStatus func(ctx context.Context, e StatusEvent)
	// Observer receives OnDeliveryUpdated for every status that changed a
	// message. Defaults to none.
	Observer outbox.Observer
	// TenantFromRequest names the tenant of a GET verification request
	// (Meta's GET carries no phone number ID). Defaults to the "tenant" path
	// value, else the "tenant" query parameter, else the X-Org-Id header,
	// else "" (a single-tenant service).
	TenantFromRequest func(r *http.Request) string
	// MaxBodyBytes limits a POST body; larger ones answer 413. Defaults to
	// DefaultMaxBodyBytes (3 MB).
	MaxBodyBytes int64
	// Logger receives structured logs (never bodies, signatures or
	// secrets). Defaults to discarding them.
	Logger *slog.Logger
	// Clock stamps receipts without a timestamp. Defaults to
	// outbox.SystemClock.
	Clock outbox.Clock
}

// Webhook is the http.Handler Meta calls: GET verifies the subscription,
// POST delivers signed notifications.
type Webhook struct {
	cfg WebhookConfig
}

// NewWebhook returns a Webhook for cfg.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	if cfg.Credentials == nil {
		return nil, outbox.InvalidParam("WebhookConfig.Credentials", "is required")
	}
	if cfg.Receipts == nil {
		return nil, outbox.InvalidParam("WebhookConfig.Receipts", "is required")
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	if cfg.Dedup == nil {
		cfg.Dedup = NewMemoryState(QuotaOptions{})
	}
	if cfg.Observer == nil {
		cfg.Observer = outbox.NopObserver{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = outbox.SystemClock
	}
	if cfg.TenantFromRequest == nil {
		cfg.TenantFromRequest = defaultTenantFromRequest
	}
	if cfg.InsecureSkipSignature {
		cfg.Logger.Warn("whatsapp: webhook signature checks are DISABLED (InsecureSkipSignature): anyone can forge receipts")
	}
	return &Webhook{cfg: cfg}, nil
}

func defaultTenantFromRequest(r *http.Request) string {
	if t := r.PathValue("tenant"); t != "" {
		return t
	}
	if t := r.URL.Query().Get("tenant"); t != "" {
		return t
	}
	return r.Header.Get("X-Org-Id")
}

// ServeHTTP implements http.Handler.
func (h *Webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		h.verify(w, r)
	case http.MethodPost:
		h.notify(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func validChallenge(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// verify answers Meta's subscription check: hub.mode=subscribe and the
// tenant's verify token echo hub.challenge as text/plain; anything else is
// 403.
func (h *Webhook) verify(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode, token, challenge := q.Get("hub.mode"), q.Get("hub.verify_token"), q.Get("hub.challenge")
	tenant := h.cfg.TenantFromRequest(r)
	if mode != "subscribe" || token == "" || !validChallenge(challenge) {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	creds, err := h.cfg.Credentials.Credentials(r.Context(), tenant)
	if err != nil {
		if errors.Is(err, ErrUnknownTenant) {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		h.cfg.Logger.ErrorContext(r.Context(), "whatsapp: webhook verification: credentials provider failed", "tenant", tenant, "err", err)
		http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
		return
	}
	if creds.VerifyToken == "" || subtle.ConstantTimeCompare([]byte(token), []byte(creds.VerifyToken)) != 1 {
		h.cfg.Logger.WarnContext(r.Context(), "whatsapp: webhook verification refused: wrong verify token", "tenant", tenant)
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, challenge)
}

type resolvedChange struct {
	tenant string
	pid    string
	value  *Value
}

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
