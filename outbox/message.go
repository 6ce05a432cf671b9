package outbox

import (
	"encoding/json"
	"fmt"
	"mime"
	"strings"
	"time"
	"unicode/utf8"
)

// Message is one outbox entry. The fields marked "set by the caller" are what
// an application fills in before Enqueue; the rest are owned by the store and
// the processor.
type Message struct {
	// ID is a ULID (26 characters, sortable by creation time). Set by
	// Enqueue when empty; a caller may supply its own, which must be a ULID
	// in its canonical upper-case form (see ValidID).
	ID string
	// Tenant is the organisation the message belongs to; "" for a
	// single-tenant service. Set by the caller; leading or trailing white
	// space is refused (" acme" would be a tenant of its own). Every store operation is
	// scoped by tenant.
	Tenant string
	// Topic routes the message to a publisher (e.g. "whatsapp", "EVENT",
	// "DISPATCH_JOB"). Set by the caller; required.
	Topic string
	// Group is the FIFO key: messages with the same (Tenant, Topic, Group)
	// are published one after the other, in enqueue order, across processors
	// and retries. "" means unordered. Set by the caller.
	Group string
	// IdempotencyKey makes Enqueue idempotent: a second message with the same
	// (Tenant, IdempotencyKey) is not inserted, the first is returned. Set by
	// the caller; "" means a fresh key (the message ID) is used.
	IdempotencyKey string
	// ContentType is the media type of Payload, e.g. "application/json",
	// "application/cloudevents+json", "application/x-protobuf" or
	// "application/octet-stream". "" means application/json (the only kind
	// of payload before content types existed, and still the default). It
	// is stored as given and handed to publishers, which send it where
	// their transport has a place for it (an HTTP Content-Type, the AMQP
	// content_type property, a NATS or Kafka header). Set by the caller;
	// it must parse as a media type (mime.ParseMediaType).
	ContentType string
	// Payload is the message body, kept byte for byte. When the content
	// type is JSON (see IsJSON) it must be one JSON document in UTF-8;
	// otherwise it may hold any bytes (protobuf, Avro, NUL bytes, invalid
	// UTF-8), and may be empty. Its size is limited by
	// Options.MaxPayloadBytes (DefaultMaxPayloadBytes, 1 MiB, by default).
	// Set by the caller.
	//
	// Payload was a json.RawMessage before content types; a []byte is
	// assignable to and from json.RawMessage, so code that sets or reads
	// it either way compiles unchanged.
	Payload []byte
	// Headers carries metadata such as trace context. Set by the caller.
	Headers map[string]string
	// MaxAttempts is the number of publish attempts before the message is
	// dead-lettered; 0 means the processor's Config.MaxAttempts. Set by the
	// caller.
	MaxAttempts int
	// NextAttemptAt is when the message may be claimed next. A caller may
	// set it to delay the first attempt; retries set it from the backoff.
	NextAttemptAt time.Time

	// Seq is the store-assigned sequence that orders a group. Read-only.
	Seq int64
	// Status is the lifecycle state. Read-only.
	Status Status
	// Attempts is the number of publish attempts started so far. Read-only.
	Attempts int
	// ProviderMessageID is the ID the publisher returned (e.g. a wamid).
	ProviderMessageID string
	// LastError is the error of the last failed attempt or receipt.
	LastError *ErrorInfo
	// CreatedAt and UpdatedAt are maintained by the store.
	CreatedAt, UpdatedAt time.Time
	// ClaimedAt and ClaimedBy describe the current lease (zero when not
	// PROCESSING).
	ClaimedAt time.Time
	ClaimedBy string
	// ClaimToken identifies the current claim (the lease) of a PROCESSING
	// message: MessageClaim sets a new one, unique to that claim of that
	// message, and every change out of PROCESSING clears it. Outcomes and
	// lease extensions carry it (Outcome.ClaimToken, Lease.ClaimToken)
	// and are applied only while it is still the message's. Owner and
	// attempt alone cannot fence them: a message released without an
	// attempt, or recovered from an expired lease (which gives the attempt
	// back), can be claimed again by the same processor at the same
	// attempt, and the first claim's late outcome would then finish the
	// second (a release putting it back to PENDING while it is published,
	// so another processor publishes it again). "" for a message that is
	// not PROCESSING, or was claimed before its store issued tokens (see
	// NewClaimToken). Read-only; opaque.
	ClaimToken string
	// SentAt, DeliveredAt and ReadAt track delivery; zero means not yet.
	SentAt, DeliveredAt, ReadAt time.Time
	// BlocksGroup reports a dead letter (FAILED) that holds its group: it
	// was dead-lettered under DeadLetterBlock, and the later messages of its
	// (Tenant, Topic, Group) are not claimed until it is requeued or
	// cancelled. Read-only; false in every other status.
	BlocksGroup bool

	// generatedID is the ID prepareMessage generated for the message (the
	// caller set none); see IDGenerated.
	generatedID string
}

// IDGenerated reports that m's ID was generated when m was prepared for
// this enqueue (by Outbox, or by MessageEnqueueParams.Prepare): the caller set none, so
// no stored message can have it (a ULID with 80 random bits). A store may
// then insert m without probing for an earlier message with its ID, when m
// has no IdempotencyKey of its own either (its key is its ID). It is false
// once ID is changed, and on the messages Outbox returns, so a message
// handed back for a second enqueue is matched against the stored one as
// usual.
func (m *Message) IDGenerated() bool { return m.ID != "" && m.ID == m.generatedID }

// ForgetGeneratedID clears what IDGenerated reports: Outbox and the stores
// that use IDGenerated call it on the messages they return.
func (m *Message) ForgetGeneratedID() { m.generatedID = "" }

// EffectiveContentType returns ContentType, or ContentTypeJSON when it is
// empty: the value a publisher sends as the payload's content type.
func (m *Message) EffectiveContentType() string {
	if m.ContentType == "" {
		return ContentTypeJSON
	}
	return m.ContentType
}

// IsJSON reports whether the message's payload is JSON: its content type is
// empty, application/json or a structured-syntax "+json" type such as
// application/cloudevents+json (parameters such as charset are ignored).
func (m *Message) IsJSON() bool { return IsJSONContentType(m.ContentType) }

// ContentTypeJSON is the content type of a message whose ContentType is
// empty.
const ContentTypeJSON = "application/json"

// IsJSONContentType reports whether ct names JSON: "" (the default),
// application/json, or any type with the "+json" suffix (RFC 6839), case
// and parameters ignored. An unparsable ct is not JSON.
func IsJSONContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == ContentTypeJSON || strings.HasSuffix(mt, "+json")
}

// GroupKey identifies the FIFO scope of m: tenant, topic and group.
func (m *Message) GroupKey() string {
	return m.Tenant + "\x00" + m.Topic + "\x00" + m.Group
}

// ErrorInfo is a stored error: a machine code and a human message. Publishers
// must keep secrets (tokens, signatures) out of both.
type ErrorInfo struct {
	Code    string
	Message string
}

// AttemptOutcome is how one publish attempt ended.
type AttemptOutcome string

// The outcomes of an attempt.
const (
	AttemptSucceeded AttemptOutcome = "SUCCEEDED"
	AttemptRetry     AttemptOutcome = "RETRY"
	AttemptFailed    AttemptOutcome = "FAILED"
)

// Attempt is the record of one publish attempt. Stores keep every attempt.
type Attempt struct {
	MessageID string
	Tenant    string
	// Number is 1 for the first attempt.
	Number  int
	Outcome AttemptOutcome
	Error   *ErrorInfo
	// ProviderResponse is what the provider answered, if the publisher
	// returned it (JSON).
	ProviderResponse json.RawMessage
	// NextAttemptAt is set when Outcome is AttemptRetry.
	NextAttemptAt time.Time
	StartedAt     time.Time
	FinishedAt    time.Time
}

// Enqueued is the result of enqueuing one message.
type Enqueued struct {
	// Message is the stored message: the new one, or the first one with the
	// same (Tenant, IdempotencyKey).
	Message Message
	// Existed reports that the idempotency key was already used; nothing was
	// inserted.
	Existed bool
}

// Limits on message fields, checked by ValidateMessage before any SQL runs.
const (
	// DefaultMaxPayloadBytes is the default of Options.MaxPayloadBytes
	// (1 MiB): the largest payload Enqueue accepts unless configured
	// otherwise.
	DefaultMaxPayloadBytes = 1 << 20
	MaxKeyLength           = 255 // Tenant, Topic, Group, IdempotencyKey, ID, ContentType
	MaxHeaderBytes         = 16 << 10
	MaxAttemptsLimit       = 1000
)

// MaxPayloadBytes is the payload limit of ValidateMessage.
//
// Deprecated: the limit is configurable with Options.MaxPayloadBytes; this
// is its default, DefaultMaxPayloadBytes.
const MaxPayloadBytes = DefaultMaxPayloadBytes

// PayloadLimiter is implemented by stores that cannot hold payloads of any
// size. MaxPayloadBytes is the store's hard ceiling: the largest payload
// it stores. New refuses an Options.MaxPayloadBytes above it (every
// Enqueue then fails), and the store refuses a larger payload itself with
// a *PayloadTooLargeError.
type PayloadLimiter interface {
	MaxPayloadBytes() int
}

// ValidateMessage checks the caller-set fields of m and returns a
// *ValidationError (matching ErrInvalidInput) naming the first bad field,
// or a *PayloadTooLargeError when the payload exceeds
// DefaultMaxPayloadBytes. A program may check a message with it up front;
// stores check every message they insert with MessageEnqueueParams.Prepare
// (which applies these checks with the configured payload limit).
func ValidateMessage(m *Message) error { return validateMessage(m, DefaultMaxPayloadBytes) }

func validateMessage(m *Message, maxPayload int) error {
	if strings.TrimSpace(m.Topic) == "" {
		return invalid("Topic", "is required")
	}
	if m.Tenant != "" && strings.TrimSpace(m.Tenant) != m.Tenant {
		return invalid("Tenant", "has leading or trailing white space (the single-tenant tenant is \"\")")
	}
	if m.ID != "" && !ValidID(m.ID) {
		return invalid("ID", "is not a ULID (26 upper-case Crockford base32 characters); leave it empty to get one")
	}
	for _, f := range []struct{ name, v string }{
		{"ID", m.ID}, {"Tenant", m.Tenant}, {"Topic", m.Topic}, {"Group", m.Group}, {"IdempotencyKey", m.IdempotencyKey},
		{"ContentType", m.ContentType},
	} {
		if len(f.v) > MaxKeyLength {
			return invalid(f.name, fmt.Sprintf("is %d bytes, the limit is %d", len(f.v), MaxKeyLength))
		}
		if !utf8.ValidString(f.v) {
			return invalid(f.name, "is not valid UTF-8")
		}
		for _, r := range f.v {
			if r == 0 || (r < 0x20 && r != '\t') {
				return invalid(f.name, "contains a control character")
			}
		}
	}
	if m.ContentType != "" {
		if _, _, err := mime.ParseMediaType(m.ContentType); err != nil {
			return invalid("ContentType", fmt.Sprintf("%q is not a media type (%v)", m.ContentType, err))
		}
	}
	if len(m.Payload) > maxPayload {
		return &PayloadTooLargeError{Size: len(m.Payload), Limit: maxPayload}
	}
	if m.IsJSON() {
		switch {
		case len(m.Payload) == 0:
			return invalid("Payload", "is required (a JSON document; set ContentType for other payloads)")
		case validJSON(m.Payload): // one pass; the checks below name the fault
		case !utf8.Valid(m.Payload):
			return invalid("Payload", "is JSON but not valid UTF-8")
		default:
			return invalid("Payload", fmt.Sprintf("is not valid JSON (content type %s; set ContentType for other payloads)", m.EffectiveContentType()))
		}
	}
	n := 0
	for k, v := range m.Headers {
		if k == "" {
			return invalid("Headers", "has an empty key")
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return invalid("Headers", "is not valid UTF-8")
		}
		n += len(k) + len(v)
	}
	if n > MaxHeaderBytes {
		return invalid("Headers", fmt.Sprintf("are %d bytes, the limit is %d", n, MaxHeaderBytes))
	}
	if m.MaxAttempts < 0 || m.MaxAttempts > MaxAttemptsLimit {
		return invalid("MaxAttempts", fmt.Sprintf("must be between 0 and %d", MaxAttemptsLimit))
	}
	return nil
}

// prepareMessage validates m (payloads up to maxPayload) and fills the
// fields Enqueue owns: ID (a new ULID when empty), IdempotencyKey (the ID
// when empty), Status PENDING, Attempts 0, CreatedAt/UpdatedAt = now and
// NextAttemptAt = now when zero. Outbox and MessageEnqueueParams.Prepare
// call it for every message.
func prepareMessage(m *Message, now time.Time, maxPayload int) error {
	if err := validateMessage(m, maxPayload); err != nil {
		return err
	}
	now = now.UTC()
	m.generatedID = ""
	if m.ID == "" {
		m.ID = NewID(now)
		m.generatedID = m.ID
	}
	if m.IdempotencyKey == "" {
		m.IdempotencyKey = m.ID
	}
	m.Status = StatusPending
	m.Attempts = 0
	m.Seq = 0
	m.ProviderMessageID = ""
	m.LastError = nil
	m.ClaimedAt, m.ClaimedBy = time.Time{}, ""
	m.SentAt, m.DeliveredAt, m.ReadAt = time.Time{}, time.Time{}, time.Time{}
	m.CreatedAt, m.UpdatedAt = now, now
	if m.NextAttemptAt.IsZero() {
		m.NextAttemptAt = now
	} else {
		m.NextAttemptAt = m.NextAttemptAt.UTC()
	}
	return nil
}
