package service

import (
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
		To: meta.To, TemplateCode: meta.TemplateCode, Status: apiStatus(m.Status), ProviderMessageID: m.ProviderMessageID,
		IdempotencyKey: m.IdempotencyKey, AttemptCount: m.Attempts, MaxAttempts: m.MaxAttempts,
		CreatedAt: m.CreatedAt.UTC(), UpdatedAt: m.UpdatedAt.UTC(),
		SentAt: optTime(m.SentAt), DeliveredAt: optTime(m.DeliveredAt), ReadAt: optTime(m.ReadAt),
		meta: meta,
	}
	if m.LastError != nil {
		v.ErrorCode, v.ErrorMessage = m.LastError.Code, m.LastError.Message
		v.LastError = &lastError{Code: m.LastError.Code, Message: m.LastError.Message}
	}
	if m.Status == outbox.StatusPending {
		v.NextAttemptAt = optTime(m.NextAttemptAt)
	}
	return v
}
