package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outboxkit/outbox"
)

// rows is the part of pgx.Rows and *sql.Rows the enqueue path uses.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type queryFunc func(ctx context.Context, sql string, args ...any) (rows, error)

func pgxQuery(q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
},
) queryFunc {
	return func(ctx context.Context, sql string, args ...any) (rows, error) {
		r, err := q.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func sqlQuery(tx *sql.Tx) queryFunc {
	return func(ctx context.Context, q string, args ...any) (rows, error) {
		r, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		return sqlRows{r}, nil
	}
}

// MessageEnqueue inserts p.Messages in a transaction of its own and commits
// it. See MessageEnqueueTx.
func (s *Store) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, wrapErr("enqueue: begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := s.enqueue(ctx, pgxQuery(tx), msgs)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, wrapErr("enqueue: commit", err)
	}
	if s.logMode {
		s.logReg.add(msgs) // committed: their groups are registered
	}
	return res, nil
}

// MessageEnqueueTx inserts p.Messages in the caller's transaction tx: they
// exist, and are published, if and only if tx commits. All messages go in
// one statement (one round trip). Invalid messages are refused with an
// error matching outbox.ErrInvalidInput before any statement runs, so tx
// stays usable. A message whose (Tenant, IdempotencyKey) is already stored
// (or earlier in the same call) is not inserted: its result holds the stored
// message with Existed = true, and tx stays usable. An explicit key is
// matched against the explicit keys of stored messages; a message without
// one (whose key is its ID) against their IDs: a key that happens to equal
// another message's ID is a key like any other. A caller-chosen ID
// already used by a message with another (Tenant, IdempotencyKey) is
// refused with an error matching outbox.ErrInvalidInput, and tx is
// aborted (roll it back), so no part of the refused call can commit.
//
// Enqueueing into an ordered group (Group != "") takes a transaction-level
// lock on that group: a second transaction enqueueing into the same group
// waits until the first commits or rolls back, which is what makes a
// group's publication order its commit order. Keep transactions short after
// enqueueing into a group, and when one transaction enqueues into several
// groups in several calls, do it in a consistent order (PostgreSQL breaks a
// deadlock by aborting one of the transactions).
func (s *Store) MessageEnqueueTx(ctx context.Context, tx pgx.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	msgs, err := s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	return s.enqueue(ctx, pgxQuery(tx), msgs)
}

// SQL returns the enqueuer for database/sql transactions opened on the same
// database through the pgx stdlib driver (github.com/jackc/pgx/v5/stdlib):
//
//	ob := outbox.New(store.SQL(), outbox.Options{})
//	tx, _ := sqlDB.BeginTx(ctx, nil)
//	_, err := ob.EnqueueTx(ctx, tx, msg)
func (s *Store) SQL() *SQLEnqueuer { return &SQLEnqueuer{s: s} }

// SQLEnqueuer is the outbox.Enqueuer[*sql.Tx] of a Store. Its
// MessageEnqueue uses the Store's own DB.
type SQLEnqueuer struct{ s *Store }

var _ outbox.Enqueuer[*sql.Tx] = (*SQLEnqueuer)(nil)

// MessageEnqueue inserts p.Messages in a transaction of its own, on the
// Store's DB.
func (e *SQLEnqueuer) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return e.s.MessageEnqueue(ctx, p)
}

// MessageEnqueueTx inserts p.Messages in the caller's database/sql
// transaction, with the same guarantees as Store.MessageEnqueueTx.
func (e *SQLEnqueuer) MessageEnqueueTx(ctx context.Context, tx *sql.Tx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	if tx == nil {
		return nil, outbox.InvalidParam("tx", "is nil")
	}
	msgs, err := e.s.prepare(p)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	return e.s.enqueue(ctx, sqlQuery(tx), msgs)
}

// prepare returns the messages ready to insert: prepared by outbox.Outbox
// already, or here for a direct caller (p.Prepare), with times at the
// stored precision (the microsecond).
func (s *Store) prepare(p outbox.MessageEnqueueParams) ([]outbox.Message, error) {
	return p.Prepare(s.at(p.Now), time.Microsecond, MaxPayloadBytes)
}

// MaxPayloadBytes is the store's payload ceiling, 64 MiB: PostgreSQL holds
// up to 1 GB in a value, but a claimed message is held whole in memory (by
// the processor, up to Config.BufferSize of them) and a batch of messages
// travels in one statement.
const MaxPayloadBytes = 64 << 20

// MaxPayloadBytes implements outbox.PayloadLimiter (see the constant).
func (s *Store) MaxPayloadBytes() int { return MaxPayloadBytes }

// MaxPayloadBytes implements outbox.PayloadLimiter (see the constant).
func (e *SQLEnqueuer) MaxPayloadBytes() int { return MaxPayloadBytes }

// tenantKey identifies a stored message for an enqueue's lookup: keyed
// tells an explicit key from a keyless message's ID (the two are matched
// separately, see MessageEnqueueTx).
type tenantKey struct {
	tenant, key string
	keyed       bool
}

func (s *Store) enqueue(ctx context.Context, query queryFunc, msgs []outbox.Message) ([]outbox.Enqueued, error) {
	n := len(msgs)
	var (
		ids, tenants, topics, groups, keys, types = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		// The payloads and headers go as they are (text, or NULL when
		// nil), without a copy: they are encoded before this call returns.
		payloads, headers, binary = make([][]byte, n), make([][]byte, n), make([][]byte, n)
		maxAttempts               = make([]int32, n)
		next                      = make([]time.Time, n)
	)
	for i := range msgs {
		m := &msgs[i]
		ids[i], tenants[i], topics[i], groups[i], keys[i] = m.ID, m.Tenant, m.Topic, m.Group, m.IdempotencyKey
		// JSON goes to the json column (operators and triggers query it),
		// everything else to bytea, byte for byte (never nil: NULL marks
		// the column not used).
		types[i] = m.ContentType
		if m.IsJSON() {
			payloads[i] = m.Payload
		} else {
			binary[i] = m.Payload
			if binary[i] == nil {
				binary[i] = []byte{}
			}
		}
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", i, outbox.InvalidParam("Headers", err.Error()))
			}
			headers[i] = b
		}
		maxAttempts[i] = int32(m.MaxAttempts) //nolint:gosec // validated <= MaxAttemptsLimit
		next[i] = m.NextAttemptAt
	}
	var args []any
	if n == 1 { // the same statement with scalars (see enqueueVariantSQL)
		args = []any{ids[0], tenants[0], topics[0], groups[0], keys[0], payloads[0], headers[0], maxAttempts[0], next[0], types[0], binary[0]}
	} else {
		args = []any{ids, nullIfAll(tenants, ""), topics, groups, nullIfSame(keys, ids), byteArray(payloads), byteArray(headers),
			maxAttempts, next, nullIfAll(types, ""), byteArray(binary)}
	}
	args = append(args, msgs[0].CreatedAt, s.groupNS, s.channel, s.notifyKey)
	notify := !s.opts.DisableNotify
	if !notify {
		args = args[:13]
	}
	r, err := query(ctx, s.enqueueSQL(msgs).enqueueStmt(n == 1, notify, unchecked(msgs)), args...)
	if err != nil {
		return nil, enqueueErr(err)
	}
	seqs := make(map[string]int64, n)
	for r.Next() {
		var id string
		var seq int64
		if err := r.Scan(&id, &seq); err != nil {
			r.Close()
			return nil, enqueueErr(err)
		}
		seqs[id] = seq
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, enqueueErr(err)
	}

	out := make([]outbox.Enqueued, n)
	var missT, missK []string
	for i := range msgs {
		if seq, ok := seqs[msgs[i].ID]; ok {
			m := msgs[i]
			m.Seq = seq
			m.ForgetGeneratedID()
			out[i] = outbox.Enqueued{Message: m}
			continue
		}
		missT, missK = append(missT, msgs[i].Tenant), append(missK, msgs[i].IdempotencyKey)
	}
	if len(missT) == 0 {
		return out, nil
	}
	// Not inserted: the (tenant, key) exists already, or the ID does.
	r, err = query(ctx, s.reads().existing, missT, missK)
	if err != nil {
		return nil, wrapErr("enqueue: existing", err)
	}
	found := make(map[tenantKey]outbox.Message, len(missT))
	for r.Next() {
		m, err := scanMessage(r)
		if err != nil {
			r.Close()
			return nil, wrapErr("enqueue: existing", err)
		}
		found[tenantKey{m.Tenant, m.IdempotencyKey, m.IdempotencyKey != m.ID}] = m
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, wrapErr("enqueue: existing", err)
	}
	for i := range msgs {
		if _, ok := seqs[msgs[i].ID]; ok {
			continue
		}
		m, ok := found[tenantKey{msgs[i].Tenant, msgs[i].IdempotencyKey, msgs[i].IdempotencyKey != msgs[i].ID}]
		if !ok {
			// Skipped, yet no message has its key: its ID is another
			// message's (another key, or another tenant). The statement
			// inserted the call's other messages into the caller's
			// transaction: abort it, so that none of them can commit.
			if r, err := query(ctx, s.sql.abortClash); err == nil {
				r.Close()
			}
			return nil, fmt.Errorf("postgres: enqueue: message %d: %w (the transaction is aborted)", i, outbox.InvalidParam("ID", "is already used by another message"))
		}
		out[i] = outbox.Enqueued{Message: m, Existed: true}
	}
	return out, nil
}

// nullIfAll returns col, or nil (a NULL array, which the statement fills
// with its default, see enqueueVariantSQL) when every element is v.
func nullIfAll(col []string, v string) []string {
	for _, e := range col {
		if e != v {
			return col
		}
	}
	return nil
}

// nullIfSame returns col, or nil (a NULL array, see nullIfAll) when it
// equals other element by element.
func nullIfSame(col, other []string) []string {
	for i, e := range col {
		if e != other[i] {
			return col
		}
	}
	return nil
}

// byteArray is a column of byte strings as a query parameter: NULL when
// every element is nil (unnest pads a NULL array with NULLs), so a batch
// without headers or without binary payloads sends none; otherwise an
// array read without reflection (pgx encodes a [][]byte through reflect).
func byteArray(col [][]byte) pgtype.FlatArray[[]byte] {
	for _, b := range col {
		if b != nil {
			return col
		}
	}
	return nil
}

// unchecked reports that no message of msgs can repeat a stored one: each
// is keyless, with an ID generated for this call (outbox.Message.IDGenerated).
// The enqueue then inserts them without a conflict check.
func unchecked(msgs []outbox.Message) bool {
	for i := range msgs {
		if !msgs[i].IDGenerated() || msgs[i].IdempotencyKey != msgs[i].ID {
			return false
		}
	}
	return true
}

// enqueueErr wraps an error of the enqueue statement. The checked
// statement skips a message whose key or ID is stored already (every unique
// index is an arbiter), and the unchecked one inserts only IDs generated
// for the call, so a unique violation on the primary key is not expected
// (a ULID collision); it is still reported as the ID clash it would be,
// matching outbox.ErrInvalidInput. (enqueue reports a skipped ID clash
// itself, see sqlText.abortClash.)
func enqueueErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && strings.HasSuffix(pe.ConstraintName, "messages_pkey") {
		return fmt.Errorf("postgres: enqueue: %w (the transaction is aborted)", outbox.InvalidParam("ID", "is already used by another message"))
	}
	return wrapErr("enqueue", err)
}

// Bits of an enqueue statement variant.
const (
	enqueueOne       = 1 << iota // one message, scalar parameters (else arrays)
	enqueueNotify                // with the NOTIFY part
	enqueueUnchecked             // no ON CONFLICT: every message's ID was generated for this call and it has no key of its own
)

// enqueueStmt is the enqueue statement for one message or several, with
// or without the NOTIFY part, with or without the conflict check.
func (t *sqlText) enqueueStmt(one, notify, unchecked bool) string {
	v := 0
	if one {
		v |= enqueueOne
	}
	if notify {
		v |= enqueueNotify
	}
	if unchecked {
		v |= enqueueUnchecked
	}
	return t.enqueue[v]
}

// enqueueVariantSQL is the enqueue statement's variant v (the enqueueOne,
// enqueueNotify and enqueueUnchecked bits). input: the messages, from
// arrays ($1-$11), or with one from scalars: a one-row input has the same
// estimates whatever its values, so after five executions PostgreSQL's
// plan cache settles on the generic plan; with arrays it kept re-planning
// the statement for every single-message enqueue on most connections (an
// unnest of a parameter is estimated at 100 rows, a planned one at 1, so
// the generic plan always looked dearer).
func enqueueVariantSQL(v int) string {
	one, notify := v&enqueueOne != 0, v&enqueueNotify != 0
	// The arrays of tenants ($2), keys ($5) and content types ($10)
	// are NULL when every message has the default (tenant '', key =
	// ID, content type ''), those of payloads, headers and binary
	// payloads when no message has one (see enqueue): unnest pads a
	// NULL array with NULLs.
	input := `SELECT u.id, coalesce(u.tenant, '') AS tenant, u.topic, u.grp, coalesce(u.ikey, u.id) AS ikey, u.payload, u.headers,
		u.max_attempts, u.next_attempt_at, coalesce(u.content_type, '') AS content_type, u.payload_bytes, u.ord
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int4[], $9::timestamptz[],
		$10::text[], $11::bytea[])
		WITH ORDINALITY AS u(id, tenant, topic, grp, ikey, payload, headers, max_attempts, next_attempt_at, content_type, payload_bytes, ord)`
	if one {
		input = `SELECT $1::text AS id, $2::text AS tenant, $3::text AS topic, $4::text AS grp, $5::text AS ikey,
		$6::text AS payload, $7::text AS headers, $8::int4 AS max_attempts, $9::timestamptz AS next_attempt_at,
		$10::text AS content_type, $11::bytea AS payload_bytes, 1::bigint AS ord`
	}
	conflict := "ON CONFLICT DO NOTHING"
	if v&enqueueUnchecked != 0 {
		conflict = ""
	}
	notifyCTE, notifyJoin := "", ""
	if notify {
		// Notify only when a listener is idle: it holds the notify
		// lock, so the shared try fails. When it succeeds the
		// listeners are short-polling and this transaction holds the
		// lock shared until it ends (see notify.go).
		notifyCTE = `, notified AS (
	SELECT count(pg_notify($14, '')) AS n FROM (SELECT 1 FROM ins LIMIT 1) x
	WHERE NOT pg_try_advisory_xact_lock_shared($15::int8)
)`
		notifyJoin = " CROSS JOIN notified"
	}
	return `WITH input AS (
	` + input + `
), locks AS MATERIALIZED (
	-- Serialise the enqueues of each group until commit, taken before any
	-- sequence number is drawn, in key order (no deadlock inside a batch).
	-- A group's commit order is therefore its sequence order.
	SELECT count(*) AS n FROM (
		SELECT pg_advisory_xact_lock($13::int4, k) FROM (
			SELECT DISTINCT hashtext(tenant || chr(31) || topic || chr(31) || grp) AS k
			FROM input WHERE grp <> '' ORDER BY 1
		) keys
	) taken
), ins AS (
	INSERT INTO {T} (id, tenant, topic, grp, idempotency_key, status, attempts, max_attempts,
		next_attempt_at, created_at, updated_at, headers, payload, content_type, payload_bytes)
	SELECT i.id, i.tenant, i.topic, i.grp, i.ikey, 'PENDING', 0, i.max_attempts,
		i.next_attempt_at, $12, $12, i.headers::jsonb, i.payload::json, i.content_type, i.payload_bytes
	FROM input i CROSS JOIN locks l
	WHERE l.n >= 0
	-- No other read of the table: the plan is cached (generic after five
	-- executions) and must stay right however the table grows.
	ORDER BY i.ord
	-- Both unique indexes are arbiters: a repeated key (the idempotency
	-- index, keyed messages only) and a repeated ID (the primary key; a
	-- keyless message's key is its ID) are skipped, and enqueue looks the
	-- stored message up. A keyless message probes the primary key only.
	-- So an explicit key is matched against explicit keys, and a keyless
	-- message against IDs. Left out (enqueueUnchecked) when every message
	-- is keyless with an ID generated for this call, which no stored
	-- message can have: a speculative insertion costs a probe of each
	-- arbiter and a WAL record more per row.
	` + conflict + `
	RETURNING id, seq
)` + notifyCTE + `
SELECT ins.id, ins.seq FROM ins` + notifyJoin
}

// existingSQL finds stored messages by (tenant, key): a keyed one through
// the idempotency index, a keyless one (its key is its ID) through the
// primary key.
const existingSQL = `SELECT {MCOLS} FROM unnest($1::text[], $2::text[]) AS k(tenant, ikey)
	JOIN {T} m ON m.tenant = k.tenant AND m.idempotency_key = k.ikey AND m.idempotency_key <> m.id
UNION ALL
SELECT {MCOLS} FROM unnest($1::text[], $2::text[]) AS k(tenant, ikey)
	JOIN {T} m ON m.id = k.ikey AND m.tenant = k.tenant AND m.idempotency_key = m.id`

// abortClashSQL fails, aborting the caller's transaction: run when an
// enqueue refuses a call whose other messages it inserted already.
const abortClashSQL = `DO $$BEGIN RAISE EXCEPTION USING ERRCODE = 'unique_violation',
	MESSAGE = 'outboxkit: enqueue refused: a caller-chosen message ID is already used by another message; the transaction is aborted';
END$$`
