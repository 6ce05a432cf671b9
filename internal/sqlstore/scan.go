package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageCols is the column list every message query selects, in the order
// ScanMessage reads.
const MessageCols = `seq, id, tenant, topic, grp, idempotency_key, payload, headers, status,
	attempts, max_attempts, next_attempt_at, provider_message_id, last_error_code, last_error_message,
	created_at, updated_at, claimed_at, claimed_by, sent_at, delivered_at, read_at, blocks_group, content_type, claim_token`

// AttemptCols is the attempt table's column list, in the order ScanAttempt
// reads and AttemptRows writes.
const AttemptCols = `message_id, tenant, number, outcome, error_code, error_message, provider_response,
	next_attempt_at, started_at, finished_at`

// Time scans a time column whatever its storage: integer Unix microseconds
// (SQLite), a DATETIME as text (MySQL without parseTime) or as a time.Time
// (parseTime, in the DSN's loc, whose wall clock is the stored UTC value).
// NULL and MySQL's zero date scan as the zero time.
type Time struct {
	T     time.Time
	Valid bool
}

// Scan implements sql.Scanner.
func (d *Time) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		d.T, d.Valid = time.Time{}, false
		return nil
	case int64:
		d.T, d.Valid = time.UnixMicro(x).UTC(), true
		return nil
	case time.Time:
		d.T = time.Date(x.Year(), x.Month(), x.Day(), x.Hour(), x.Minute(), x.Second(), x.Nanosecond(), time.UTC)
		d.Valid = !x.IsZero()
		return nil
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	}
	return fmt.Errorf("cannot scan %T into a time", v)
}

func (d *Time) parse(s string) error {
	if s == "" || strings.HasPrefix(s, "0000-00-00") {
		d.T, d.Valid = time.Time{}, false
		return nil
	}
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("time %q: %w", s, err)
	}
	d.T, d.Valid = t, true
	return nil
}

// RowScanner is *sql.Row or *sql.Rows.
type RowScanner interface {
	Scan(dest ...any) error
}

// ScanMessage reads one row of MessageCols.
func ScanMessage(r RowScanner) (outbox.Message, error) {
	var (
		m                                                       outbox.Message
		payload, headers                                        []byte
		provider, errCode, errMsg, claimBy, claimToken          sql.NullString
		status                                                  string
		next, created, updated, claimedAt, sentAt, deliv, readA Time
	)
	err := r.Scan(&m.Seq, &m.ID, &m.Tenant, &m.Topic, &m.Group, &m.IdempotencyKey, &payload, &headers, &status,
		&m.Attempts, &m.MaxAttempts, &next, &provider, &errCode, &errMsg,
		&created, &updated, &claimedAt, &claimBy, &sentAt, &deliv, &readA, &m.BlocksGroup, &m.ContentType, &claimToken)
	if err != nil {
		return outbox.Message{}, err
	}
	m.Payload = payload
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			return outbox.Message{}, fmt.Errorf("message %s: headers: %w", m.ID, err)
		}
	}
	m.Status = outbox.Status(status)
	m.NextAttemptAt = next.T
	m.ProviderMessageID = provider.String
	if errCode.Valid || errMsg.Valid {
		m.LastError = &outbox.ErrorInfo{Code: errCode.String, Message: errMsg.String}
	}
	m.CreatedAt, m.UpdatedAt = created.T, updated.T
	m.ClaimedAt, m.ClaimedBy, m.ClaimToken = claimedAt.T, claimBy.String, claimToken.String
	m.SentAt, m.DeliveredAt, m.ReadAt = sentAt.T, deliv.T, readA.T
	return m, nil
}

// ScanMessages reads every row of MessageCols and closes rows.
func ScanMessages(rows *sql.Rows) ([]outbox.Message, error) {
	defer rows.Close()
	var out []outbox.Message
	for rows.Next() {
		m, err := ScanMessage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// ScanAttempt reads one row of AttemptCols.
func ScanAttempt(r RowScanner) (outbox.Attempt, error) {
	var (
		a                      outbox.Attempt
		outcome                string
		errCode, errMsg        sql.NullString
		resp                   []byte
		next, started, finishd Time
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
	a.NextAttemptAt, a.StartedAt, a.FinishedAt = next.T, started.T, finishd.T
	return a, nil
}

// QuerySeqs runs a query selecting one integer column.
func QuerySeqs(ctx context.Context, q Querier, query string, args ...any) ([]int64, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Placeholders returns "?, ?, ..., ?" with n marks.
func Placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}

// Int64s converts seqs to arguments.
func Int64s(seqs []int64) []any {
	out := make([]any, len(seqs))
	for i, v := range seqs {
		out[i] = v
	}
	return out
}

// NullString is s, or NULL for "".
func NullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// IsNoRows reports sql.ErrNoRows.
func IsNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// NotFound is the error for a message ID unknown in a tenant.
func NotFound(tenant, id string) error {
	return fmt.Errorf("%w: id %q in tenant %q", outbox.ErrNotFound, id, tenant)
}

// Now returns t, or clock's time when t is zero, in UTC truncated to the
// microsecond (the precision both databases store).
func Now(clock outbox.Clock, t time.Time) time.Time {
	if t.IsZero() {
		t = clock.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// AttemptRows collects attempt rows for one multi-row INSERT.
type AttemptRows struct {
	d    Syntax
	args []any
}

// NewAttemptRows returns an empty batch of attempt rows for d.
func NewAttemptRows(d Syntax) *AttemptRows { return &AttemptRows{d: d} }

// Add appends one attempt; next may be the zero time (no retry).
func (a *AttemptRows) Add(id, tenant string, n int, outcome outbox.AttemptOutcome, e *outbox.ErrorInfo, resp json.RawMessage, next, start, finish time.Time) {
	var code, msg any
	if e != nil {
		code, msg = e.Code, e.Message
	}
	a.args = append(a.args, id, tenant, n, string(outcome), code, msg, a.d.NullText(resp),
		a.d.NullTime(next), a.d.Time(start), a.d.Time(finish))
}

// AddOutcome appends the attempt o records (none for a release) for its
// message of tenant; next is o's due time and start its StartedAt, both at
// the store's precision.
func (a *AttemptRows) AddOutcome(o outbox.Outcome, tenant string, next, start, finish time.Time) {
	outcome, ok := o.Kind.AttemptOutcome()
	if !ok {
		return
	}
	if o.Kind != outbox.OutcomeRetry {
		next = time.Time{}
	}
	a.Add(o.ID, tenant, o.Attempt, outcome, o.Error, o.ProviderResponse, next, start, finish)
}

// Exec inserts the collected rows into table, if any.
func (a *AttemptRows) Exec(ctx context.Context, q Querier, table string) error {
	if len(a.args) == 0 {
		return nil
	}
	row := "(" + Placeholders(10) + ")"
	n := len(a.args) / 10
	_, err := q.ExecContext(ctx, `INSERT INTO `+table+` (`+AttemptCols+`) VALUES `+
		strings.TrimSuffix(strings.Repeat(row+", ", n), ", "), a.args...)
	return err
}
