package seedcore

import (
	"database/sql"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// Row is one row (or document) of a seed table.
type Row struct {
	ID, Type     string
	Group        sql.NullString
	Payload      string
	Status       string
	RetryCount   int
	CreatedAt    time.Time
	ProcessedAt  sql.NullTime
	ErrorMessage sql.NullString
}

// Columns are the seed table's columns, in the order of Row.Dest.
const Columns = `id, type, message_group, payload, status, retry_count, created_at, processed_at, error_message`

// Dest returns the scan destinations of Columns.
func (r *Row) Dest() []any {
	return []any{&r.ID, &r.Type, &r.Group, &r.Payload, &r.Status, &r.RetryCount, &r.CreatedAt, &r.ProcessedAt, &r.ErrorMessage}
}

// groupOf maps message_group to the message's Group.
func (c *Core) groupOf(g sql.NullString) string {
	if !g.Valid && !c.UnorderedNull {
		return DefaultNullGroup
	}
	return g.String
}

// Message maps r to an outbox.Message of topic.
func (c *Core) Message(r *Row, topic string) outbox.Message {
	m := outbox.Message{
		ID: r.ID, Topic: topic, Group: c.groupOf(r.Group), Payload: []byte(r.Payload),
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.CreatedAt.UTC(),
	}
	if id, err := flowcatalyst.ParseTSID(r.ID); err == nil {
		m.Seq = int64(id & (1<<63 - 1))
	}
	if r.ErrorMessage.Valid {
		code, msg, ok := strings.Cut(r.ErrorMessage.String, ": ")
		if !ok || strings.ContainsAny(code, " \t") {
			code, msg = "error", r.ErrorMessage.String
		}
		m.LastError = &outbox.ErrorInfo{Code: code, Message: msg}
	}
	pa := r.ProcessedAt.Time.UTC()
	m.Status = OutboxStatus(r.Status)
	switch r.Status {
	case StatusPending:
		m.Attempts = r.RetryCount
		m.NextAttemptAt = m.CreatedAt
		if r.ProcessedAt.Valid {
			m.NextAttemptAt = pa
		}
	case StatusProcessing:
		m.Attempts = r.RetryCount + 1
		m.ClaimedAt, m.UpdatedAt = pa, pa
		// The tables have no owner or token column: a lease this Store
		// took of the row, with this claim time, tells them.
		c.mu.Lock()
		if l, ok := c.leases[leaseKey{topic, r.ID}]; ok && l.claimedAt.Equal(pa) && l.attempt == m.Attempts {
			m.ClaimedBy, m.ClaimToken = l.owner, l.token
		}
		c.mu.Unlock()
	case StatusCompleted:
		m.Attempts = r.RetryCount + 1
		m.SentAt, m.UpdatedAt = pa, pa
	case StatusFailed:
		m.Attempts = r.RetryCount + 1
		m.UpdatedAt = pa
	}
	if m.UpdatedAt.IsZero() {
		m.UpdatedAt = m.CreatedAt
	}
	return m
}

// OutboxStatus maps a seed status to outbox's (COMPLETED is SENT); an
// unknown one is kept as is.
func OutboxStatus(seed string) outbox.Status {
	switch seed {
	case StatusPending:
		return outbox.StatusPending
	case StatusProcessing:
		return outbox.StatusProcessing
	case StatusCompleted:
		return outbox.StatusSent
	case StatusFailed:
		return outbox.StatusFailed
	}
	return outbox.Status(seed)
}

// SeedStatus maps an outbox status to the seed's; false for one the seed
// has not (CANCELLED, DELIVERED).
func SeedStatus(st outbox.Status) (string, bool) {
	switch st {
	case outbox.StatusPending:
		return StatusPending, true
	case outbox.StatusProcessing:
		return StatusProcessing, true
	case outbox.StatusSent:
		return StatusCompleted, true
	case outbox.StatusFailed:
		return StatusFailed, true
	}
	return "", false
}

// ErrorText is e as error_message holds it: "code: message".
func ErrorText(e outbox.ErrorInfo) string {
	code := strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == ':' {
			return '_'
		}
		return r
	}, e.Code)
	if code == "" {
		code = "error"
	}
	return code + ": " + e.Message
}

// LeaseExpiredText is the error_message of a row that recovery marks
// FAILED (Options.RecoveryCountsAttempt).
var LeaseExpiredText = ErrorText(outbox.ErrorInfo{Code: "lease_expired", Message: "the processor did not finish the attempt in time"})
