package sqlite

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// messageCols is the column list every message query selects, in the order
// scanMessage reads.
const messageCols = `seq, id, tenant, topic, grp, idempotency_key, payload, headers, status,
	attempts, max_attempts, next_attempt_at, provider_message_id, last_error_code, last_error_message,
	created_at, updated_at, claimed_at, claimed_by, sent_at, delivered_at, read_at`

const attemptCols = `message_id, tenant, number, outcome, error_code, error_message, provider_response,
	next_attempt_at, started_at, finished_at`

// queries holds the SQL that names tables, rendered once for a prefix.
type queries struct {
	messages, attempts string

	insert, selectByKey, selectByID, selectByProvider string
	claimUnordered, claimUnorderedTopics              string
	nextGroupHead, groupPrefix, claimUpdate           string
	sent, retry, dead, release                        string
	insertAttempt                                     string
}

func newQueries(prefix string) queries {
	m, a := prefix+"messages", prefix+"attempts"
	q := queries{messages: m, attempts: a}
	q.insert = `INSERT INTO ` + m + ` (id, tenant, topic, grp, idempotency_key, payload, headers, status,
		attempts, max_attempts, next_attempt_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, ?, ?, ?, ?)
		ON CONFLICT DO NOTHING
		RETURNING ` + messageCols
	q.selectByKey = `SELECT ` + messageCols + ` FROM ` + m + ` WHERE tenant = ? AND idempotency_key = ?`
	q.selectByID = `SELECT ` + messageCols + ` FROM ` + m + ` WHERE tenant = ? AND id = ?`
	q.selectByProvider = `SELECT ` + messageCols + ` FROM ` + m +
		` WHERE tenant = ? AND provider_message_id = ? ORDER BY seq DESC LIMIT 1`

	// The claim reads due unordered messages in seq order, and walks the
	// groups (one index seek per group with open messages) to read the
	// claimable prefix of each: the group's open messages from its head up
	// to the first one that is PROCESSING or not yet due.
	q.claimUnordered = `SELECT seq FROM ` + m + ` WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?
		ORDER BY seq LIMIT ?`
	q.claimUnorderedTopics = `SELECT seq FROM ` + m + ` WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?
		AND topic IN (SELECT value FROM json_each(?)) ORDER BY seq LIMIT ?`
	q.nextGroupHead = `SELECT tenant, topic, grp, status, next_attempt_at FROM ` + m + `
		WHERE status IN ('PENDING', 'PROCESSING') AND (tenant, topic, grp) > (?, ?, ?)
		ORDER BY tenant, topic, grp, seq LIMIT 1`
	q.groupPrefix = `SELECT seq, status, next_attempt_at FROM ` + m + `
		WHERE tenant = ? AND topic = ? AND grp = ? AND status IN ('PENDING', 'PROCESSING')
		ORDER BY seq LIMIT ? OFFSET ?`
	q.claimUpdate = `UPDATE ` + m + ` SET status = 'PROCESSING', attempts = attempts + 1,
		claimed_at = ?, claimed_by = ?, updated_at = ?
		WHERE seq IN (SELECT value FROM json_each(?)) AND status = 'PENDING'
		RETURNING ` + messageCols

	fence := ` WHERE id = ? AND status = 'PROCESSING' AND claimed_by = ? AND attempts = ?`
	q.sent = `UPDATE ` + m + ` SET status = 'SENT', provider_message_id = ?, sent_at = ?, updated_at = ?,
		claimed_at = NULL, claimed_by = NULL` + fence + ` RETURNING tenant`
	q.retry = `UPDATE ` + m + ` SET status = 'PENDING', next_attempt_at = ?, last_error_code = ?,
		last_error_message = ?, updated_at = ?, claimed_at = NULL, claimed_by = NULL` + fence + ` RETURNING tenant`
	q.dead = `UPDATE ` + m + ` SET status = 'FAILED', last_error_code = ?, last_error_message = ?,
		updated_at = ?, claimed_at = NULL, claimed_by = NULL` + fence + ` RETURNING tenant`
	// A release with a due time is a deferral (quota, throttle): the new due
	// time and the reason are kept; a plain release keeps both as they were.
	q.release = `UPDATE ` + m + ` SET status = 'PENDING', attempts = attempts - 1, updated_at = ?,
		next_attempt_at = COALESCE(?, next_attempt_at),
		last_error_code = COALESCE(?, last_error_code), last_error_message = COALESCE(?, last_error_message),
		claimed_at = NULL, claimed_by = NULL` + fence + ` RETURNING tenant`
	q.insertAttempt = `INSERT INTO ` + a + ` (` + attemptCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	return q
}

type rowScanner interface {
	Scan(dest ...any) error
}

// micros converts t to the stored form: NULL for the zero time, else Unix
// microseconds.
func micros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func fromMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func scanMessage(r rowScanner) (outbox.Message, error) {
	var (
		m                                           outbox.Message
		payload                                     string
		headers, provider, errCode, errMsg, claimBy sql.NullString
		status                                      string
		next, created, updated                      int64
		claimedAt, sentAt, deliveredAt, readAt      sql.NullInt64
	)
	err := r.Scan(&m.Seq, &m.ID, &m.Tenant, &m.Topic, &m.Group, &m.IdempotencyKey, &payload, &headers, &status,
		&m.Attempts, &m.MaxAttempts, &next, &provider, &errCode, &errMsg,
		&created, &updated, &claimedAt, &claimBy, &sentAt, &deliveredAt, &readAt)
	if err != nil {
		return outbox.Message{}, err
	}
	m.Payload = json.RawMessage(payload)
	if headers.Valid && headers.String != "" {
		if err := json.Unmarshal([]byte(headers.String), &m.Headers); err != nil {
			return outbox.Message{}, fmt.Errorf("sqlite: message %s: headers: %w", m.ID, err)
		}
	}
	m.Status = outbox.Status(status)
	m.NextAttemptAt = time.UnixMicro(next).UTC()
	m.ProviderMessageID = provider.String
	if errCode.Valid || errMsg.Valid {
		m.LastError = &outbox.ErrorInfo{Code: errCode.String, Message: errMsg.String}
	}
	m.CreatedAt = time.UnixMicro(created).UTC()
	m.UpdatedAt = time.UnixMicro(updated).UTC()
	m.ClaimedAt = fromMicros(claimedAt)
	m.ClaimedBy = claimBy.String
	m.SentAt = fromMicros(sentAt)
	m.DeliveredAt = fromMicros(deliveredAt)
	m.ReadAt = fromMicros(readAt)
	return m, nil
}

func scanMessages(rows *sql.Rows) ([]outbox.Message, error) {
	defer rows.Close()
	var out []outbox.Message
	for rows.Next() {
		m, err := scanMessage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

func scanAttempt(r rowScanner) (outbox.Attempt, error) {
	var (
		a                     outbox.Attempt
		outcome               string
		errCode, errMsg, resp sql.NullString
		next                  sql.NullInt64
		started, finished     int64
	)
	if err := r.Scan(&a.MessageID, &a.Tenant, &a.Number, &outcome, &errCode, &errMsg, &resp, &next, &started, &finished); err != nil {
		return outbox.Attempt{}, err
	}
	a.Outcome = outbox.AttemptOutcome(outcome)
	if errCode.Valid || errMsg.Valid {
		a.Error = &outbox.ErrorInfo{Code: errCode.String, Message: errMsg.String}
	}
	if resp.Valid {
		a.ProviderResponse = json.RawMessage(resp.String)
	}
	a.NextAttemptAt = fromMicros(next)
	a.StartedAt = time.UnixMicro(started).UTC()
	a.FinishedAt = time.UnixMicro(finished).UTC()
	return a, nil
}

// isUniqueViolation reports a UNIQUE or PRIMARY KEY constraint failure.
func isUniqueViolation(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}
