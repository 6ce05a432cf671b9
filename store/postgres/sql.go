package postgres

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outboxkit/outbox"
)

// sqlText holds every statement, rendered once for the store's tables.
type sqlText struct {
	// enqueue holds the enqueue statement's variants, indexed by the
	// enqueueOne, enqueueNotify and enqueueUnchecked bits (see enqueueStmt).
	enqueue  [8]string
	existing string
	// abortClash fails, aborting the caller's transaction: run when an
	// enqueue refuses a call whose other messages it inserted already.
	abortClash string

	claimAll, claimTopics                 string
	claimFairAll, claimFairTopics         string
	fairTenants                           string
	claimFallbackAll, claimFallbackTopics string

	finish    [16]string // by finishSQL's mask
	finishTID [16]string // the same, rows found by tuple ID
	recover   string
	extend    string

	get, list, count, countAll string
	attempts                   string
	cancel, requeue            string
	statusOf                   string
	receiptLock, receiptUpdate string
	prune                      string
	pruneCount                 string
	pendingTopics              string
}

// msgCols is the column list scanned by scanMessage, in order.
const msgCols = `id, seq, tenant, topic, grp, idempotency_key, status, attempts, max_attempts,
	next_attempt_at, created_at, updated_at, claimed_at, claimed_by, provider_message_id,
	last_error_code, last_error_message, sent_at, delivered_at, read_at, headers, payload, blocks_group, content_type, payload_bytes,
	claim_token`

func prefixed(alias string) string {
	cols := strings.Split(msgCols, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// buildSQL renders every statement for s's tables and options. Each is
// written beside the operation that runs it, as a template or a function
// of its variant: the enqueue in enqueue.go, the claim in claim.go and
// fair.go, the outcome and the recovery in finish.go, the lease renewal in
// lease.go, the reads, the operator's changes, the receipts and the prune
// in query.go, the pending topics in topics.go. In a template, {T}, {A}
// and {P} name the messages, attempts and pauses tables; {COLS} is
// msgCols, {MCOLS} and {UCOLS} the same columns of the rows m and u; and
// {ASYNC} is an expression, always evaluated, that with
// Options.AsyncCommit turns synchronous_commit off for the statement's own
// (implicit) transaction (the claim, outcome and recovery statements).
func buildSQL(s *Store) sqlText {
	async := "'on'"
	if s.opts.AsyncCommit {
		async = "set_config('synchronous_commit', 'off', true)"
	}
	q := strings.NewReplacer("{ASYNC}", async, "{T}", s.messages, "{P}", s.pauses, "{A}", s.attempts, "{COLS}", msgCols, "{MCOLS}", prefixed("m"), "{UCOLS}", prefixed("u")).Replace
	t := sqlText{
		existing:            q(existingSQL),
		abortClash:          abortClashSQL,
		claimAll:            q(claimSQL(false, false)),
		claimTopics:         q(claimSQL(true, false)),
		claimFairAll:        q(claimSQL(false, true)),
		claimFairTopics:     q(claimSQL(true, true)),
		fairTenants:         q(fairTenantsSQL()),
		claimFallbackAll:    q(claimFallbackSQL(false)),
		claimFallbackTopics: q(claimFallbackSQL(true)),
		recover:             q(recoverSQL),
		extend:              q(extendSQL),
		get:                 q(getSQL),
		list:                q(listSQL),
		count:               q(countSQL),
		countAll:            q(countAllSQL),
		attempts:            q(attemptsSQL),
		cancel:              q(cancelSQL),
		requeue:             q(requeueSQL),
		statusOf:            q(statusOfSQL),
		receiptLock:         q(receiptLockSQL),
		receiptUpdate:       q(receiptUpdateSQL),
		prune:               q(pruneSQL),
		pruneCount:          q(pruneCountSQL),
		pendingTopics:       q(pendingTopicsSQL),
	}
	for v := range t.enqueue {
		t.enqueue[v] = q(enqueueVariantSQL(v))
	}
	del := len(s.opts.DeleteSentTopics) > 0
	for mask := range t.finish {
		t.finish[mask] = q(finishSQL(mask, false, del))
		t.finishTID[mask] = q(finishSQL(mask, true, del))
	}
	return t
}

// scanner is pgx.Row, pgx.Rows or *sql.Rows.
type scanner interface {
	Scan(dest ...any) error
}

// nullable scan targets shared by the pgx and database/sql paths.
type msgRow struct {
	m                                                   outbox.Message
	claimedAt, sentAt, deliveredAt, readAt              *time.Time
	claimedBy, providerID, errCode, errMsg, status, grp *string
	claimToken                                          pgtype.UUID
	headers                                             []byte
	payload, payloadBytes                               []byte
	blocks                                              *bool
}

func (r *msgRow) dest() []any {
	m := &r.m
	return []any{&m.ID, &m.Seq, &m.Tenant, &m.Topic, &r.grp, &m.IdempotencyKey, &r.status,
		&m.Attempts, &m.MaxAttempts, &m.NextAttemptAt, &m.CreatedAt, &m.UpdatedAt,
		&r.claimedAt, &r.claimedBy, &r.providerID, &r.errCode, &r.errMsg,
		&r.sentAt, &r.deliveredAt, &r.readAt, &r.headers, &r.payload, &r.blocks, &m.ContentType, &r.payloadBytes,
		&r.claimToken}
}

func (r *msgRow) message() (outbox.Message, error) {
	m := r.m
	m.Group = deref(r.grp)
	m.Status = outbox.Status(deref(r.status))
	m.ClaimedAt = derefTime(r.claimedAt)
	m.ClaimedBy = deref(r.claimedBy)
	if r.claimToken.Valid {
		m.ClaimToken = r.claimToken.String()
	}
	m.ProviderMessageID = deref(r.providerID)
	if r.errCode != nil || r.errMsg != nil {
		m.LastError = &outbox.ErrorInfo{Code: deref(r.errCode), Message: deref(r.errMsg)}
	}
	m.SentAt, m.DeliveredAt, m.ReadAt = derefTime(r.sentAt), derefTime(r.deliveredAt), derefTime(r.readAt)
	m.NextAttemptAt, m.CreatedAt, m.UpdatedAt = m.NextAttemptAt.UTC(), m.CreatedAt.UTC(), m.UpdatedAt.UTC()
	if len(r.headers) > 0 {
		if err := json.Unmarshal(r.headers, &m.Headers); err != nil {
			return m, err
		}
	}
	// JSON payloads are in payload (json), the others in payload_bytes.
	if r.payload != nil {
		m.Payload = append([]byte(nil), r.payload...)
	} else {
		m.Payload = append([]byte{}, r.payloadBytes...)
	}
	m.BlocksGroup = r.blocks != nil && *r.blocks
	return m, nil
}

func scanMessage(s scanner) (outbox.Message, error) {
	var r msgRow
	if err := s.Scan(r.dest()...); err != nil {
		return outbox.Message{}, err
	}
	return r.message()
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func derefTime(p *time.Time) time.Time {
	if p == nil {
		return time.Time{}
	}
	return p.UTC()
}

// text makes s storable in a PostgreSQL text column: valid UTF-8, no NUL.
func text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	return s
}

// texts is text of each of ss, never nil (a nil slice would be an SQL
// NULL array).
func texts(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = text(s)
	}
	return out
}

// nullText is text(s), or nil for "".
func nullText(s string) *string {
	if s == "" {
		return nil
	}
	t := text(s)
	return &t
}

// nullTime is t truncated to microseconds, or nil for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC().Truncate(time.Microsecond)
	return &u
}

// jsonText returns a provider response as storable JSON text: as is when it
// is valid JSON, else quoted as a JSON string, nil when empty. A publisher's
// malformed response must not make the outcome unrecordable.
func jsonText(b json.RawMessage) *string {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) && !hasNullEscape(b) {
		s := string(b)
		return &s
	}
	q, _ := json.Marshal(text(string(b)))
	s := string(q)
	return &s
}

// hasNullEscape reports a \u0000 escape, which PostgreSQL's json input
// accepts but jsonb and some clients reject; quoting is the safe side.
func hasNullEscape(b []byte) bool {
	return strings.Contains(string(b), `\u0000`)
}
