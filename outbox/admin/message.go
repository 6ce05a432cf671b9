package admin

import (
	"encoding/json"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Message is the JSON form of an outbox.Message: what the API answers and
// what outboxctl prints (list --json, show --json), so a script reads one
// shape from either. Times a message does not have yet are omitted.
type Message struct {
	ID                string            `json:"id"`
	Seq               int64             `json:"seq"`
	Tenant            string            `json:"tenant"`
	Topic             string            `json:"topic"`
	Group             string            `json:"group,omitempty"`
	IdempotencyKey    string            `json:"idempotency_key"`
	Status            outbox.Status     `json:"status"`
	Attempts          int               `json:"attempts"`
	MaxAttempts       int               `json:"max_attempts,omitempty"`
	NextAttemptAt     time.Time         `json:"next_attempt_at,omitzero"`
	ProviderMessageID string            `json:"provider_message_id,omitempty"`
	ErrorCode         string            `json:"error_code,omitempty"`
	ErrorMessage      string            `json:"error_message,omitempty"`
	CreatedAt         time.Time         `json:"created_at"`
	UpdatedAt         time.Time         `json:"updated_at"`
	SentAt            *time.Time        `json:"sent_at,omitempty"`
	DeliveredAt       *time.Time        `json:"delivered_at,omitempty"`
	ReadAt            *time.Time        `json:"read_at,omitempty"`
	Headers           map[string]string `json:"headers,omitempty"`
	// ContentType is the message's content type, omitted when it is ""
	// (application/json).
	ContentType string `json:"content_type,omitempty"`
	// Payload is a JSON payload as it is stored; null for any other
	// content type, whose bytes are PayloadBase64 (standard base64).
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
	// PayloadBytes is the payload's length in bytes.
	PayloadBytes int `json:"payload_bytes"`
	// BlocksGroup marks a dead letter that holds its group.
	BlocksGroup bool `json:"blocks_group,omitempty"`
}

// NewMessage returns the JSON form of m.
func NewMessage(m outbox.Message) Message {
	out := Message{
		ID: m.ID, Seq: m.Seq, Tenant: m.Tenant, Topic: m.Topic, Group: m.Group, IdempotencyKey: m.IdempotencyKey,
		Status: m.Status, Attempts: m.Attempts, MaxAttempts: m.MaxAttempts, NextAttemptAt: m.NextAttemptAt,
		ProviderMessageID: m.ProviderMessageID, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt,
		SentAt: optTime(m.SentAt), DeliveredAt: optTime(m.DeliveredAt), ReadAt: optTime(m.ReadAt),
		Headers: m.Headers, ContentType: m.ContentType, PayloadBytes: len(m.Payload), BlocksGroup: m.BlocksGroup,
	}
	if m.IsJSON() {
		out.Payload = json.RawMessage(m.Payload)
	} else {
		out.PayloadBase64 = m.Payload
	}
	if m.LastError != nil {
		out.ErrorCode, out.ErrorMessage = m.LastError.Code, m.LastError.Message
	}
	if len(out.Payload) == 0 {
		out.Payload = json.RawMessage("null")
	}
	return out
}

// Attempt is the JSON form of an outbox.Attempt.
type Attempt struct {
	Number           int                   `json:"number"`
	Outcome          outbox.AttemptOutcome `json:"outcome"`
	ErrorCode        string                `json:"error_code,omitempty"`
	ErrorMessage     string                `json:"error_message,omitempty"`
	ProviderResponse json.RawMessage       `json:"provider_response,omitempty"`
	NextAttemptAt    *time.Time            `json:"next_attempt_at,omitempty"`
	StartedAt        time.Time             `json:"started_at"`
	FinishedAt       time.Time             `json:"finished_at"`
}

// NewAttempt returns the JSON form of a.
func NewAttempt(a outbox.Attempt) Attempt {
	out := Attempt{Number: a.Number, Outcome: a.Outcome, ProviderResponse: a.ProviderResponse,
		NextAttemptAt: optTime(a.NextAttemptAt), StartedAt: a.StartedAt, FinishedAt: a.FinishedAt}
	if a.Error != nil {
		out.ErrorCode, out.ErrorMessage = a.Error.Code, a.Error.Message
	}
	return out
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
