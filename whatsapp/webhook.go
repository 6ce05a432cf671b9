package whatsapp

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// DefaultMaxBodyBytes is the largest webhook body accepted: Meta sends up to
// 3 MB.
const DefaultMaxBodyBytes = 3 << 20

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
