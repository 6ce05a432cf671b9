package mysql

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

// queries holds the table names and the fixed SQL, rendered once for a
// prefix.
type queries struct {
	messages, attempts, groups string

	insert, lockGroup, selectByKey, selectByID string
}

func newQueries(prefix string) queries {
	m := prefix + "messages"
	q := queries{messages: m, attempts: prefix + "attempts", groups: prefix + "groups"}
	// "id = id" changes nothing: a duplicate (tenant, idempotency_key) or id
	// inserts nothing, reports 0 affected rows and raises no error, so the
	// caller's transaction goes on.
	q.insert = `INSERT INTO ` + m + ` (id, tenant, topic, grp, idempotency_key, payload, headers, status,
		attempts, max_attempts, next_attempt_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE id = id`
	q.lockGroup = `INSERT INTO ` + q.groups + ` (tenant, topic, grp) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE grp = grp`
	// A locking read sees the newest committed row whatever the caller's
	// isolation level (a REPEATABLE READ snapshot may predate it).
	q.selectByKey = `SELECT ` + messageCols + ` FROM ` + m + ` WHERE tenant = ? AND idempotency_key = ? LOCK IN SHARE MODE`
	q.selectByID = `SELECT ` + messageCols + ` FROM ` + m + ` WHERE tenant = ? AND id = ?`
	return q
}

// dbTimeLayout is how times are sent to the server: DATETIME(6) literals in
// UTC. Sending strings (not time.Time) keeps the stored value independent of
// the DSN's loc parameter.
const dbTimeLayout = "2006-01-02 15:04:05.000000"

// ts converts t to a DATETIME(6) argument in UTC.
func ts(t time.Time) string { return t.UTC().Format(dbTimeLayout) }

// nts is ts for a nullable column: NULL for the zero time.
func nts(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return ts(t)
}

// dbTime scans a DATETIME column holding UTC, whether the driver returns it
// as text (no parseTime) or as a time.Time (parseTime, in the DSN's loc,
// whose wall clock is the stored UTC value).
type dbTime struct {
	t     time.Time
	valid bool
}

func (d *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		d.t, d.valid = time.Time{}, false
		return nil
	case time.Time:
		d.t = time.Date(x.Year(), x.Month(), x.Day(), x.Hour(), x.Minute(), x.Second(), x.Nanosecond(), time.UTC)
		d.valid = !x.IsZero()
		return nil
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	}
	return fmt.Errorf("mysql: cannot scan %T into a time", v)
}

func (d *dbTime) parse(s string) error {
	if s == "" || strings.HasPrefix(s, "0000-00-00") {
		d.t, d.valid = time.Time{}, false
		return nil
	}
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("mysql: time %q: %w", s, err)
	}
	d.t, d.valid = t, true
	return nil
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
	return []byte(b)
}

type rowScanner interface {
	Scan(dest ...any) error
}

func scanMessage(r rowScanner) (outbox.Message, error) {
	var (
		m                                                       outbox.Message
		payload, headers                                        []byte
		provider, errCode, errMsg, claimBy                      sql.NullString
		status                                                  string
		next, created, updated, claimedAt, sentAt, deliv, readA dbTime
	)
	err := r.Scan(&m.Seq, &m.ID, &m.Tenant, &m.Topic, &m.Group, &m.IdempotencyKey, &payload, &headers, &status,
		&m.Attempts, &m.MaxAttempts, &next, &provider, &errCode, &errMsg,
		&created, &updated, &claimedAt, &claimBy, &sentAt, &deliv, &readA)
	if err != nil {
		return outbox.Message{}, err
	}
	m.Payload = json.RawMessage(payload)
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			return outbox.Message{}, fmt.Errorf("mysql: message %s: headers: %w", m.ID, err)
		}
	}
	m.Status = outbox.Status(status)
	m.NextAttemptAt = next.t
	m.ProviderMessageID = provider.String
	if errCode.Valid || errMsg.Valid {
		m.LastError = &outbox.ErrorInfo{Code: errCode.String, Message: errMsg.String}
	}
	m.CreatedAt, m.UpdatedAt = created.t, updated.t
	m.ClaimedAt, m.ClaimedBy = claimedAt.t, claimBy.String
	m.SentAt, m.DeliveredAt, m.ReadAt = sentAt.t, deliv.t, readA.t
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
		a                      outbox.Attempt
		outcome                string
		errCode, errMsg        sql.NullString
		resp                   []byte
		next, started, finishd dbTime
	)
	if err := r.Scan(&a.MessageID, &a.Tenant, &a.Number, &outcome, &errCode, &errMsg, &resp, &next, &started, &finishd); err != nil {
		return outbox.Attempt{}, err
	}
	a.Outcome = outbox.AttemptOutcome(outcome)
	if errCode.Valid || errMsg.Valid {
		a.Error = &outbox.ErrorInfo{Code: errCode.String, Message: errMsg.String}
	}
	if resp != nil {
		a.ProviderResponse = json.RawMessage(resp)
	}
	a.NextAttemptAt, a.StartedAt, a.FinishedAt = next.t, started.t, finishd.t
	return a, nil
}

// placeholders returns "?, ?, ..., ?" with n marks.
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}
