package service

import (
	"encoding/json"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// apiStatus is the one place where outboxkit's statuses become the seed's:
//
//	outboxkit    API (seed 001)
//	PENDING      QUEUED     waiting for the processor (first attempt or a retry)
//	PROCESSING   SENDING    leased by a processor, being sent
//	SENT         SENT       accepted by the Cloud API (it returned a wamid)
//	DELIVERED    DELIVERED  delivered receipt; a read receipt keeps DELIVERED and sets readAt
//	FAILED       FAILED     permanent error or attempts used up (retry endpoint: back to QUEUED)
//	CANCELLED    CANCELLED  not used by the API
func apiStatus(s outbox.Status) string {
	switch s {
	case outbox.StatusPending:
		return "QUEUED"
	case outbox.StatusProcessing:
		return "SENDING"
	default:
		return string(s)
	}
}

// lastError is the error of the last failed attempt or receipt.
type lastError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// messageView is the API's message (seed 001's response shape plus the
// delivery tracking fields). Times are UTC (RFC 3339).
type messageView struct {
	ID                string     `json:"id"`
	OrgID             string     `json:"orgId"`
	DossierID         int64      `json:"dossierId"`
	Channel           string     `json:"channel"`
	Direction         string     `json:"direction"`
	To                string     `json:"to"`
	TemplateCode      string     `json:"templateCode,omitempty"`
	Subject           string     `json:"subject,omitempty"`
	Status            string     `json:"status"`
	ProviderMessageID string     `json:"providerMessageId,omitempty"`
	IdempotencyKey    string     `json:"idempotencyKey"`
	AttemptCount      int        `json:"attemptCount"`
	MaxAttempts       int        `json:"maxAttempts"`
	ErrorCode         string     `json:"errorCode,omitempty"`
	ErrorMessage      string     `json:"errorMessage,omitempty"`
	LastError         *lastError `json:"lastError,omitempty"`
	NextAttemptAt     *time.Time `json:"nextAttemptAt,omitempty"`
	CreatedAt         time.Time  `json:"createdAt"`
	UpdatedAt         time.Time  `json:"updatedAt"`
	SentAt            *time.Time `json:"sentAt,omitempty"`
	DeliveredAt       *time.Time `json:"deliveredAt,omitempty"`
	ReadAt            *time.Time `json:"readAt,omitempty"`

	meta messageMeta
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func view(m outbox.Message, meta messageMeta) messageView {
	v := messageView{
		ID: m.ID, OrgID: m.Tenant, DossierID: meta.DossierID, Channel: meta.Channel, Direction: "OUTBOUND",
		To: meta.To, TemplateCode: meta.TemplateCode, Subject: meta.Subject, Status: apiStatus(m.Status), ProviderMessageID: m.ProviderMessageID,
		IdempotencyKey: m.IdempotencyKey, AttemptCount: m.Attempts, MaxAttempts: m.MaxAttempts,
		CreatedAt: m.CreatedAt.UTC(), UpdatedAt: m.UpdatedAt.UTC(),
		SentAt: optTime(m.SentAt), DeliveredAt: optTime(m.DeliveredAt), ReadAt: optTime(m.ReadAt),
		meta: meta,
	}
	// A message that reached SENT or DELIVERED carries no error, as in the
	// seeds: the store keeps the last failed attempt's error, which the
	// attempt history (GET .../attempts) shows.
	if m.LastError != nil && m.Status != outbox.StatusSent && m.Status != outbox.StatusDelivered {
		v.ErrorCode, v.ErrorMessage = m.LastError.Code, m.LastError.Message
		v.LastError = &lastError{Code: m.LastError.Code, Message: m.LastError.Message}
	}
	if m.Status == outbox.StatusPending {
		v.NextAttemptAt = optTime(m.NextAttemptAt)
	}
	return v
}

// attemptStatus is the seed's attempt status of an outcome (seed 001's
// outbound_attempt.status): SUCCESS, or FAILED for a failed attempt,
// retried (nextRetryAt set) or not.
func attemptStatus(o outbox.AttemptOutcome) string {
	if o == outbox.AttemptSucceeded {
		return "SUCCESS"
	}
	return "FAILED"
}

// attemptView is one row of a message's attempt history (seed 001's
// outbound_attempt).
type attemptView struct {
	AttemptNo        int             `json:"attemptNo"`
	Status           string          `json:"status"`
	ErrorCode        string          `json:"errorCode,omitempty"`
	ErrorMessage     string          `json:"errorMessage,omitempty"`
	ProviderResponse json.RawMessage `json:"providerResponse,omitempty"`
	NextRetryAt      *time.Time      `json:"nextRetryAt,omitempty"`
	CreatedAt        time.Time       `json:"createdAt"`
	UpdatedAt        time.Time       `json:"updatedAt"`
}

func viewAttempt(a outbox.Attempt) attemptView {
	v := attemptView{AttemptNo: a.Number, Status: attemptStatus(a.Outcome), CreatedAt: a.StartedAt.UTC(), UpdatedAt: a.FinishedAt.UTC()}
	if a.FinishedAt.IsZero() {
		v.UpdatedAt = v.CreatedAt
	}
	if a.Error != nil {
		v.ErrorCode, v.ErrorMessage = a.Error.Code, a.Error.Message
	}
	if json.Valid(a.ProviderResponse) {
		v.ProviderResponse = a.ProviderResponse
	}
	if a.Outcome == outbox.AttemptRetry {
		v.NextRetryAt = optTime(a.NextAttemptAt)
	}
	return v
}
