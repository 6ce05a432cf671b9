package postgres

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outboxkit/internal/adminsql"
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

	finish    [16]string // by finishMask
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

func buildSQL(s *Store) sqlText {
	// With Options.AsyncCommit, the claim, outcome and recovery statements
	// turn synchronous_commit off for their own (implicit) transaction, in
	// an expression that is always evaluated.
	async := "'on'"
	if s.opts.AsyncCommit {
		async = "set_config('synchronous_commit', 'off', true)"
	}
	r := strings.NewReplacer("{ASYNC}", async, "{T}", s.messages, "{P}", s.pauses, "{A}", s.attempts, "{COLS}", msgCols, "{MCOLS}", prefixed("m"), "{UCOLS}", prefixed("u"))
	q := func(sql string) string { return r.Replace(sql) }

	// The enqueue. input: the messages, from arrays ($1-$11), or with one
	// from scalars: a one-row input has the same estimates whatever its
	// values, so after five executions PostgreSQL's plan cache settles on
	// the generic plan; with arrays it kept re-planning the statement for
	// every single-message enqueue on most connections (an unnest of a
	// parameter is estimated at 100 rows, a planned one at 1, so the
	// generic plan always looked dearer).
	enqueue := func(v int) string {
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
		return q(`WITH input AS (
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
SELECT ins.id, ins.seq FROM ins` + notifyJoin)
	}

	// waiting is the group index's predicate (see migration 11) for the
	// rows aliased a: a group's PENDING messages and the dead letters that
	// block it.
	waiting := func(a string) string {
		return "(" + a + ".status = 'PENDING' OR " + a + ".blocks_group) AND " + a + ".grp <> ''"
	}
	// firstLeased is the seq of the first leased (PROCESSING) message of
	// the group of the row aliased a, or the largest bigint when none is:
	// one descent of the lease index.
	// With a floor (an expression: see groupFloors), the descent starts at
	// it.
	firstLeased := func(a, floor string) string {
		from := ""
		if floor != "" {
			from = " AND l.seq >= " + floor
		}
		return `coalesce((
			SELECT l.seq FROM {T} l
			WHERE l.tenant = ` + a + `.tenant AND l.topic = ` + a + `.topic AND l.grp = ` + a + `.grp AND l.status = 'PROCESSING'` + from + `
			ORDER BY l.tenant, l.topic, l.grp, l.seq
			LIMIT 1
		), 9223372036854775807)`
	}
	// The claim. win: the first $4 pending ordered messages by sequence.
	// heads: those that are due and first among their group's unfinished
	// messages (PENDING, PROCESSING, or a dead letter that blocks its group:
	// blocks_group). The group index holds the waiting ones (PENDING and
	// blocking dead letters) and the lease index the PROCESSING ones, each
	// by group (see migration 11): a head is the first of its group in the
	// one and before every message of its group in the other, and its run
	// ends before its group's first leased message. runs: from each head,
	// the consecutive due PENDING messages of its group (at most $5), with
	// their position in the run. free: due
	// unordered messages. cand: the oldest $3 of both. locked: those still
	// PENDING and due in their newest version (FOR UPDATE re-checks a row
	// another claimer changed since this statement's snapshot) and not
	// row-locked by another claimer. pairs: each locked row beside its
	// candidate. valid: a run's message is kept only if
	// every message before it in the run was locked too, so a message is
	// never claimed while an earlier one of its group is held by someone
	// else. The final row carries the window's size and last sequence so the
	// caller knows whether to look past it.
	// Paused topics and groups (outbox.Admin) are not claimed.
	notPaused := adminsql.NotPausedRowByRow("{P}", "")
	// cand's order is oldest runs first or, for the fair-share claim
	// (fair), each run's first message, then each run's second, and so on:
	// every tenant's run gets its head in however small a claim. The
	// fair-share claim takes no unordered message.
	claimTail := func(topicFilter string, fair bool) string {
		order, unordered := "c.rank_seq, c.seq", ""
		if fair {
			order, unordered = "c.pos, c.rank_seq, c.seq", " AND false"
		}
		return `
runs AS MATERIALIZED (
	SELECT r.id, r.pos, h.seq AS rank_seq, r.seq, r.tid
	FROM heads h CROSS JOIN LATERAL (
		SELECT x.id, x.seq, x.pos, x.tid FROM (
			SELECT m.id, m.seq, m.ctid AS tid,
				row_number() OVER (ORDER BY m.seq) AS pos,
				bool_and(m.status = 'PENDING' AND m.next_attempt_at <= $1) OVER (ORDER BY m.seq) AS ok
			FROM {T} m
			WHERE m.tenant = h.tenant AND m.topic = h.topic AND m.grp = h.grp
				AND ` + waiting("m") + ` AND m.seq >= h.seq AND m.seq < h.leased
			ORDER BY m.tenant, m.topic, m.grp, m.seq
			LIMIT $5
		) x
		WHERE x.ok
	) r
	LIMIT $3
), free AS MATERIALIZED (
	SELECT id, 1::bigint AS pos, seq AS rank_seq, seq, ctid AS tid FROM {T}
	WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= $1` + topicFilter + notPaused + unordered + `
	ORDER BY next_attempt_at
	LIMIT $3
), cand AS MATERIALIZED (
	SELECT c.id, c.pos, c.tid FROM (SELECT * FROM runs UNION ALL SELECT * FROM free) c
	ORDER BY ` + order + `
	LIMIT $3
), locked AS MATERIALIZED (
	-- Rows are found by the tuple IDs read above, in one TID scan of an
	-- array (no primary-key descent, and no rescan per row: each rescan
	-- of a TID scan reads the relation's size). A tuple ID read in this
	-- statement names the same row version for its whole snapshot. cur is
	-- the ID of the version locked: another one when the row was changed
	-- since the snapshot (FOR UPDATE then re-checks and locks the newest
	-- version); such a row is not claimed (valid matches cur against the
	-- tuple ID read), so the versions upd finds are the ones locked.
	SELECT m.id, m.tenant, m.topic, m.grp, m.seq, m.ctid AS cur
	FROM {T} m
	WHERE m.ctid = ANY(ARRAY(SELECT tid FROM cand)) AND m.status = 'PENDING' AND m.next_attempt_at <= $1
	FOR UPDATE OF m SKIP LOCKED
), pairs AS MATERIALIZED (
	-- Each locked row beside its candidate. A FULL JOIN because PostgreSQL
	-- runs one only as a hash or merge join, never as a nested loop: with
	-- no estimates to go by (a generic plan, or a table never analysed) an
	-- inner join of the two was planned as a nested loop, quadratic in the
	-- claim's size (a claim of 242 spent 100 ms in it). Materialized, so
	-- the filter below cannot turn it back into an inner join. Every locked
	-- row has its candidate (it was found by the candidate's tuple ID); a
	-- candidate not locked has none (cur is NULL).
	SELECT l.tenant, l.topic, l.grp, l.seq, l.cur, c.pos, c.tid
	FROM locked l FULL JOIN cand c ON c.id = l.id
), valid AS (
	SELECT v.tid FROM (
		SELECT p.grp, p.pos, p.tid,
			row_number() OVER (PARTITION BY p.tenant, p.topic, p.grp ORDER BY p.seq) AS rk
		FROM pairs p WHERE p.cur = p.tid
	) v
	WHERE v.grp = '' OR v.rk = v.pos
), upd AS (
	-- The versions locked above (this statement holds their row locks).
	UPDATE {T} m SET status = 'PROCESSING', attempts = m.attempts + 1,
		claimed_at = $1, claimed_by = $2, updated_at = $1, claim_token = gen_random_uuid()
	WHERE m.ctid = ANY(ARRAY(SELECT tid FROM valid)) AND m.status = 'PENDING'
	RETURNING {MCOLS}, m.ctid::text AS tid
)`
	}
	// The window starts at $6, a sequence number no later than the first
	// pending message of the store's last look (see windowLows), so it does
	// not walk the index entries of the messages claimed since, which stay
	// in the claim index until a vacuum removes them.
	//
	// $7 holds the store's group floors (a JSON object: see groupFloors):
	// each window row carries its group's floor, or 0 when the group has
	// none or the row is below it (a floor is a hint: a waiting message
	// below it voids it), and the lookups of its group's first waiting and
	// first leased message start there.
	//
	// With fair, the window is not the oldest pending messages but, for
	// each tenant of the array $6 (see MessageClaim's fair share), the
	// first waiting message of its first group (in the group index's
	// order) that has one due, and $4 is unused.
	claim := func(topics, fair bool) string {
		tf := ""
		if topics {
			tf = " AND topic = ANY($8::text[])"
		}
		floor := `coalesce(($7::jsonb ->> (tenant || chr(31) || topic || chr(31) || grp))::int8, 0)`
		src := `SELECT id, tenant, topic, grp, seq, next_attempt_at, ctid AS tid, ` + floor + ` AS floor
		FROM {T}
		WHERE status = 'PENDING' AND grp <> '' AND seq >= $6` + tf + notPaused + `
		ORDER BY seq
		LIMIT $4`
		if fair {
			ftf := ""
			if topics {
				ftf = " AND c.topic = ANY($8::text[])"
			}
			src = `SELECT f.id, f.tenant, f.topic, f.grp, f.seq, f.next_attempt_at, f.tid,
			coalesce(($7::jsonb ->> (f.tenant || chr(31) || f.topic || chr(31) || f.grp))::int8, 0) AS floor
		FROM unnest($6::text[]) WITH ORDINALITY AS tl(tenant, ord)
		CROSS JOIN LATERAL (
			SELECT c.id, c.tenant, c.topic, c.grp, c.seq, c.next_attempt_at, c.ctid AS tid FROM {T} c
			WHERE c.tenant = tl.tenant AND ` + waiting("c") + ftf + `
				AND c.status = 'PENDING' AND c.next_attempt_at <= $1` + adminsql.NotPausedRowByRow("{P}", "c.") + `
			ORDER BY c.tenant, c.topic, c.grp, c.seq
			LIMIT 1
		) f
		WHERE $4::int4 IS NOT NULL
		ORDER BY tl.ord`
		}
		// The floors apply only on the server they were learned on (the
		// object's key "" names it by its start time): after a failover or
		// a restore, sequence numbers can be drawn again below them.
		return q(`WITH srv AS MATERIALIZED (
	SELECT ($7::jsonb ->> '') IS NOT DISTINCT FROM extract(epoch FROM pg_postmaster_start_time())::text AS same
), win AS MATERIALIZED (
	SELECT x.id, x.tenant, x.topic, x.grp, x.seq, x.next_attempt_at, x.tid,
		CASE WHEN x.floor <= x.seq AND (SELECT same FROM srv) THEN x.floor ELSE 0 END AS floor
	FROM (
		` + src + `
	) x
), heads AS MATERIALIZED (
	-- Heads are row-locked as they are taken (SKIP LOCKED), so concurrent
	-- claimers spread over different groups instead of all reaching for
	-- the oldest ones. win is materialized in sequence order and read in
	-- that order, lazily: no ORDER BY, so only as many heads are checked
	-- and locked as the runs need. (Which heads come first is fairness,
	-- not correctness: valid below re-checks every run.)
	SELECT m.tenant, m.topic, m.grp, m.seq, ` + firstLeased("w", "w.floor") + ` AS leased
	FROM win w JOIN {T} m ON m.ctid = w.tid
	WHERE m.id = w.id AND w.next_attempt_at <= $1
		-- w is its group's head: the first waiting message of the group,
		-- one descent of the group index (ordered by its whole key, so no
		-- other plan is cheaper, with or without statistics), and before
		-- the group's first leased message, one descent of the lease
		-- index, made only for a first waiting message (CASE fixes the
		-- order: most window rows are not their group's first).
		AND CASE WHEN w.seq = (
			SELECT b.seq FROM {T} b
			WHERE b.tenant = w.tenant AND b.topic = w.topic AND b.grp = w.grp AND ` + waiting("b") + `
				AND b.seq >= w.floor
			ORDER BY b.tenant, b.topic, b.grp, b.seq
			LIMIT 1
		) THEN w.seq < ` + firstLeased("w", "w.floor") + ` ELSE false END
		AND m.status = 'PENDING' AND m.next_attempt_at <= $1
	LIMIT $3
	FOR UPDATE OF m SKIP LOCKED
),` + claimTail(tf, fair) + `
SELECT s.scanned, s.maxseq, s.minseq, extract(epoch FROM pg_postmaster_start_time())::text AS srv, {UCOLS}, u.tid
FROM (
	-- The window's size matters only when the runs did not fill the claim
	-- (then every head, hence the whole window, was read already). Its
	-- first sequence number is its first row's (win is in order).
	SELECT CASE WHEN (SELECT count(*) FROM runs) < $3 THEN (SELECT count(*) FROM win) ELSE 0 END AS scanned,
		CASE WHEN (SELECT count(*) FROM runs) < $3 THEN (SELECT coalesce(max(seq), 0) FROM win) ELSE 0 END AS maxseq,
		coalesce((SELECT seq FROM win LIMIT 1), 0) AS minseq,
		{ASYNC} AS sc
) s
LEFT JOIN upd u ON true
ORDER BY u.seq`)
	}
	// The fallback claim, used when the window was full of blocked groups:
	// a loose index scan visits every group with unfinished messages (one
	// index descent each) and takes the heads past the window.
	claimFallback := func(topics bool) string {
		tf, tfh := "", ""
		if topics {
			tf = " AND topic = ANY($6::text[])"
			tfh = " AND g.topic = ANY($6::text[])"
		}
		return q(`WITH RECURSIVE groups AS (
	(SELECT m.id, m.tenant, m.topic, m.grp, m.seq, m.status, m.next_attempt_at FROM {T} m
	WHERE ` + waiting("m") + `
	ORDER BY m.tenant, m.topic, m.grp, m.seq
	LIMIT 1)
	UNION ALL
	SELECT n.id, n.tenant, n.topic, n.grp, n.seq, n.status, n.next_attempt_at
	FROM groups g CROSS JOIN LATERAL (
		SELECT m.id, m.tenant, m.topic, m.grp, m.seq, m.status, m.next_attempt_at FROM {T} m
		WHERE ` + waiting("m") + `
			AND (m.tenant, m.topic, m.grp) > (g.tenant, g.topic, g.grp)
		ORDER BY m.tenant, m.topic, m.grp, m.seq
		LIMIT 1
	) n
), heads AS MATERIALIZED (
	SELECT m.tenant, m.topic, m.grp, m.seq, h.leased FROM (
		SELECT g.id, g.seq, ` + firstLeased("g", "") + ` AS leased FROM groups g
		WHERE g.status = 'PENDING' AND g.next_attempt_at <= $1 AND g.seq > $4` + tfh + adminsql.NotPaused("{P}", "g.") + `
		ORDER BY g.seq
	) h JOIN {T} m ON m.id = h.id
	WHERE m.status = 'PENDING' AND m.next_attempt_at <= $1 AND h.seq < h.leased
	LIMIT $3
	FOR UPDATE OF m SKIP LOCKED
),` + claimTail(tf, false) + `
SELECT 0::bigint AS scanned, 0::bigint AS maxseq, 0::bigint AS minseq, extract(epoch FROM pg_postmaster_start_time())::text AS srv, {UCOLS}, u.tid
FROM (SELECT {ASYNC} AS sc) s
LEFT JOIN upd u ON true
ORDER BY u.seq`)
	}

	var finish, finishTID [16]string
	for mask := range finish {
		del := len(s.opts.DeleteSentTopics) > 0
		finish[mask] = q(finishSQL(mask, false, del))
		finishTID[mask] = q(finishSQL(mask, true, del))
	}

	// Recovery: an expired lease goes back to PENDING without its attempt
	// counted (the processor that held it may never have published it) and
	// with one more recovery; the recovery that reaches $3 (MaxRecoveries)
	// dead-letters it instead. Either way the lost claim is kept as an
	// attempts row numbered like the claim.
	recoverSQL := q(`WITH exp AS (
	SELECT id, claimed_at, attempts FROM {T}
	WHERE status = 'PROCESSING' AND claimed_at < $1
	ORDER BY claimed_at
	LIMIT $4
	FOR UPDATE SKIP LOCKED
), upd AS (
	UPDATE {T} m SET
		status = CASE WHEN m.recoveries + 1 >= $3 THEN 'FAILED' ELSE 'PENDING' END,
		attempts = greatest(m.attempts - 1, 0), recoveries = m.recoveries + 1,
		-- A dead letter holds its group when the topic's policy says so
		-- (outbox.DeadLetterRule: $5 the default, $6 blocking topics, $7
		-- continuing ones).
		blocks_group = m.recoveries + 1 >= $3 AND m.grp <> ''
			AND (m.topic = ANY($6::text[]) OR ($5::boolean AND NOT m.topic = ANY($7::text[]))),
		last_error_code = 'lease_expired',
		last_error_message = 'the lease expired before the processor recorded an outcome',
		updated_at = $2, claimed_at = NULL, claimed_by = NULL, claim_token = NULL
	FROM exp
	WHERE m.id = exp.id AND m.status = 'PROCESSING'
	RETURNING m.id, m.tenant, exp.attempts, m.status, m.next_attempt_at, exp.claimed_at
), att AS (
	INSERT INTO {A} (message_id, tenant, number, outcome, error_code, error_message,
		next_attempt_at, started_at, finished_at)
	SELECT id, tenant, attempts, CASE status WHEN 'FAILED' THEN 'FAILED' ELSE 'RETRY' END,
		'lease_expired', 'the lease expired before the processor recorded an outcome',
		CASE status WHEN 'FAILED' THEN NULL ELSE next_attempt_at END, claimed_at, $2
	FROM upd
)
SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'FAILED'), min({ASYNC}) FROM upd`)

	// What a requeue sets (MessageRequeue, MessageRequeueMany).
	const requeueSet = `status = 'PENDING', attempts = 0, recoveries = 0, next_attempt_at = $3, updated_at = $3,
		claimed_at = NULL, claimed_by = NULL, claim_token = NULL, provider_message_id = NULL, blocks_group = false,
		sent_at = NULL, delivered_at = NULL, read_at = NULL,
		sent_response = NULL, sent_started_at = NULL, sent_finished_at = NULL`
	// The list's filters, the same in both of its parts.
	const listFilter = ` AND ($3 = '' OR status = $3) AND ($4 = '' OR topic = $4) AND ($5 = '' OR grp = $5)
		AND (NOT $7::boolean OR (status = 'FAILED' AND blocks_group))`
	var enqueues [8]string
	for v := range enqueues {
		enqueues[v] = enqueue(v)
	}
	return sqlText{
		enqueue: enqueues,
		// A stored message by (tenant, key): a keyed one through the
		// idempotency index, a keyless one (its key is its ID) through the
		// primary key.
		existing: q(`SELECT {MCOLS} FROM unnest($1::text[], $2::text[]) AS k(tenant, ikey)
	JOIN {T} m ON m.tenant = k.tenant AND m.idempotency_key = k.ikey AND m.idempotency_key <> m.id
UNION ALL
SELECT {MCOLS} FROM unnest($1::text[], $2::text[]) AS k(tenant, ikey)
	JOIN {T} m ON m.id = k.ikey AND m.tenant = k.tenant AND m.idempotency_key = m.id`),
		abortClash: `DO $$BEGIN RAISE EXCEPTION USING ERRCODE = 'unique_violation',
	MESSAGE = 'outboxkit: enqueue refused: a caller-chosen message ID is already used by another message; the transaction is aborted';
END$$`,
		pendingTopics:   q(pendingTopicsSQL),
		claimAll:        claim(false, false),
		claimTopics:     claim(true, false),
		claimFairAll:    claim(false, true),
		claimFairTopics: claim(true, true),
		// The next $2 tenants from $1 on (in byte order) that have a
		// waiting message: one descent of the group index each.
		fairTenants: q(`WITH RECURSIVE tn AS (
	(SELECT m.tenant FROM {T} m WHERE ` + waiting("m") + ` AND m.tenant >= $1
	ORDER BY m.tenant, m.topic, m.grp, m.seq
	LIMIT 1)
	UNION ALL
	SELECT (SELECT m.tenant FROM {T} m WHERE ` + waiting("m") + ` AND m.tenant > tn.tenant
		ORDER BY m.tenant, m.topic, m.grp, m.seq
		LIMIT 1)
	FROM tn WHERE tn.tenant IS NOT NULL
)
SELECT tenant FROM tn WHERE tenant IS NOT NULL LIMIT $2`),
		claimFallbackAll:    claimFallback(false),
		claimFallbackTopics: claimFallback(true),
		finish:              finish,
		finishTID:           finishTID,
		recover:             recoverSQL,
		extend:              q(extendSQL),
		get:                 q(`SELECT {COLS} FROM {T} WHERE tenant = $1 AND id = $2`),
		// A tenant's messages: the (tenant, seq) index holds every row but
		// the leased ones (claimed_by set: see migration 10), which the
		// lease index holds; the two are merged by seq.
		list: q(`SELECT {COLS} FROM (
	(SELECT {COLS} FROM {T}
	WHERE tenant = $1 AND seq > $2 AND claimed_by IS NULL AND status <> 'PROCESSING'` + listFilter + `
	ORDER BY seq
	LIMIT $6)
	UNION ALL
	(SELECT {COLS} FROM {T}
	WHERE status = 'PROCESSING' AND tenant = $1 AND seq > $2` + listFilter + `
	ORDER BY seq
	LIMIT $6)
) l
ORDER BY seq
LIMIT $6`),
		count: q(`SELECT status, count(*) FROM (
	SELECT status FROM {T} WHERE tenant = $1 AND claimed_by IS NULL AND status <> 'PROCESSING'
	UNION ALL
	SELECT status FROM {T} WHERE status = 'PROCESSING' AND tenant = $1
) c
GROUP BY status`),
		countAll: q(`SELECT status, count(*) FROM {T} GROUP BY status`),
		// The attempts of a message, with a first-attempt success read from
		// the message row (sent_* columns: see finishSQL) as attempt 1.
		attempts: q(`SELECT message_id, tenant, number, outcome, error_code, error_message, provider_response,
	next_attempt_at, started_at, finished_at
FROM (
	SELECT 0::bigint AS k, m.id AS message_id, m.tenant, 1 AS number, 'SUCCEEDED'::text AS outcome,
		NULL::text AS error_code, NULL::text AS error_message, m.sent_response AS provider_response,
		NULL::timestamptz AS next_attempt_at, m.sent_started_at AS started_at, m.sent_finished_at AS finished_at
	FROM {T} m
	WHERE m.tenant = $1 AND m.id = $2 AND m.sent_finished_at IS NOT NULL
	UNION ALL
	SELECT id, message_id, tenant, number, outcome, error_code, error_message, provider_response,
		next_attempt_at, started_at, finished_at
	FROM {A} WHERE tenant = $1 AND message_id = $2
) h
ORDER BY k`),
		// A cancelled dead letter that blocked its group releases it: the
		// processors are woken.
		cancel: q(`WITH upd AS (
	UPDATE {T} SET status = 'CANCELLED', updated_at = $3, blocks_group = false
	WHERE tenant = $1 AND id = $2 AND status IN ('PENDING', 'FAILED')
	RETURNING {COLS}
), woke AS (
	SELECT count(pg_notify($4, '')) AS n FROM (SELECT 1 FROM upd LIMIT 1) x WHERE $4 <> ''
)
SELECT upd.* FROM upd CROSS JOIN woke`),
		// A requeue clears sent_at: a first-attempt success kept on the
		// message row moves to the attempts table first. A dead letter of a
		// group that did not hold its group (later messages may have been
		// published since) takes a new sequence number, drawn under its
		// group's enqueue lock: it goes to the end of its group, as a new
		// message would, and stays above every group floor (see
		// groupFloors). One that held its group keeps its place (first).
		requeue: q(`WITH old AS (
	SELECT id, tenant, topic, grp, blocks_group, sent_response, sent_started_at, sent_finished_at FROM {T}
	WHERE tenant = $1 AND id = $2 AND status = 'FAILED'
	FOR UPDATE
), lk AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock($5::int4, hashtext(tenant || chr(31) || topic || chr(31) || grp))) AS n
	FROM old WHERE grp <> '' AND NOT blocks_group
), upd_keep AS (
	UPDATE {T} m SET ` + requeueSet + `
	FROM old
	WHERE m.id = old.id AND m.status = 'FAILED' AND (old.blocks_group OR old.grp = '')
	RETURNING {MCOLS}
), upd_move AS (
	UPDATE {T} m SET seq = DEFAULT, ` + requeueSet + `
	FROM old CROSS JOIN lk
	WHERE m.id = old.id AND m.status = 'FAILED' AND NOT old.blocks_group AND old.grp <> '' AND lk.n >= 0
	RETURNING {MCOLS}
), upd AS (
	SELECT * FROM upd_keep UNION ALL SELECT * FROM upd_move
), kept AS (
	INSERT INTO {A} (message_id, tenant, number, outcome, provider_response, started_at, finished_at)
	SELECT old.id, old.tenant, 1, 'SUCCEEDED', old.sent_response, old.sent_started_at, old.sent_finished_at
	FROM old JOIN upd ON upd.id = old.id
	WHERE old.sent_finished_at IS NOT NULL
), woke AS (
	SELECT count(pg_notify($4, '')) AS n FROM (SELECT 1 FROM upd LIMIT 1) x WHERE $4 <> ''
)
SELECT upd.* FROM upd CROSS JOIN woke`),
		statusOf: q(`SELECT status FROM {T} WHERE tenant = $1 AND id = $2`),
		receiptLock: q(`SELECT {COLS} FROM {T}
WHERE tenant = $1 AND provider_message_id = $2
ORDER BY seq DESC
LIMIT 1
FOR UPDATE`),
		receiptUpdate: q(`UPDATE {T} SET status = $2, sent_at = $3, delivered_at = $4, read_at = $5,
	last_error_code = $6, last_error_message = $7, updated_at = $8
WHERE id = $1`),
		prune: q(`WITH victims AS (
	SELECT id FROM {T}
	WHERE status = ANY($3::text[]) AND updated_at < $1 AND NOT blocks_group AND ($4 = '' OR topic = $4)
	ORDER BY updated_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), del AS (
	DELETE FROM {T} m USING victims v WHERE m.id = v.id RETURNING m.id
), del_attempts AS (
	DELETE FROM {A} a USING del WHERE a.message_id = del.id
)
SELECT count(*) FROM del`),
		pruneCount: q(`SELECT count(*) FROM {T}
	WHERE status = ANY($2::text[]) AND updated_at < $1 AND NOT blocks_group AND ($3 = '' OR topic = $3)`),
	}
}

// Kinds of outcome in a MessageFinish call, as bits of the statement
// variant: only the kinds present are in the statement, so no UPDATE scans
// for an empty list.
const (
	finishSent = 1 << iota
	finishRetry
	finishDead
	finishReleased
)

// finishSQL returns the MessageFinish statement for the kinds in mask. $1 is
// now, $2 the owner, $3 the NOTIFY channel (empty for none); each present kind
// then takes its arrays, in the order sent, retry, dead, released, each
// followed by its tuple IDs with byTID; with deleteSent the sent kind then
// takes the topics whose sent messages are deleted.
func finishSQL(mask int, byTID, deleteSent bool) string {
	n := 3
	arg := func(typ string) string {
		n++
		return fmt.Sprintf("$%d::%s", n, typ)
	}
	// The claim token (NULL in x.tok for an outcome without one) tells this
	// claim from an earlier or later one of the same owner and attempt.
	fence := `m.status = 'PROCESSING' AND m.claimed_by = $2 AND m.attempts = x.attempt
		AND m.claim_token::text IS NOT DISTINCT FROM x.tok`
	// from returns the unnest of one kind's arrays (types, named cols) and
	// the condition that finds the rows: by message ID, or with byTID by
	// the tuple ID the claim returned (one more text[] array, x.tid), the
	// message ID still checked.
	from := func(cols string, types ...string) string {
		args := make([]string, len(types))
		for i, t := range types {
			args[i] = arg(t)
		}
		match := "m.id = x.id"
		if byTID {
			// All rows in one TID scan of the array, joined to x by ID
			// (a hash join: tidSettings turns nested loops off, so the
			// scan runs once, not once per outcome).
			match = "m.ctid = ANY(" + arg("text[]") + "::tid[]) AND m.id = x.id"
		}
		return "unnest(" + strings.Join(args, ", ") + ")\n\t\tAS x(" + cols + ")\n\tWHERE " + match + " AND " + fence
	}
	var ctes, attempts, applied []string
	if mask&finishSent != 0 {
		src := from("id, attempt, tok, pmid, resp, started", "text[]", "int4[]", "text[]", "text[]", "text[]", "timestamptz[]")
		keep := ""
		if deleteSent {
			// Options.DeleteSentTopics: those messages are deleted (with
			// their attempt history, if any) instead of updated.
			topics := arg("text[]")
			keep = " AND NOT m.topic = ANY(" + topics + ")"
			ctes = append(ctes, `s_del AS (
	DELETE FROM {T} m USING `+src+` AND m.topic = ANY(`+topics+`)
	RETURNING m.id
)`, `s_hist AS (
	DELETE FROM {A} a WHERE a.message_id = ANY(ARRAY(SELECT id FROM s_del))
)`)
			applied = append(applied, "SELECT id FROM s_del")
		}
		ctes = append(ctes, `s_up AS (
	UPDATE {T} m SET status = 'SENT', provider_message_id = x.pmid,
		sent_at = coalesce(m.sent_at, $1), updated_at = $1, claimed_at = NULL, claimed_by = NULL, claim_token = NULL,
		sent_response = CASE WHEN x.attempt = 1 AND m.recoveries = 0 THEN x.resp::json END,
		sent_started_at = CASE WHEN x.attempt = 1 AND m.recoveries = 0 THEN x.started END,
		sent_finished_at = CASE WHEN x.attempt = 1 AND m.recoveries = 0 THEN $1 END
	FROM `+src+keep+`
	RETURNING m.id, m.tenant, x.attempt, 'SUCCEEDED'::text AS outcome, NULL::text AS code, NULL::text AS msg,
		x.resp, NULL::timestamptz AS next, x.started, (x.attempt = 1 AND m.recoveries = 0) AS kept
)`)
		// A success at the first attempt with no history (no lost lease
		// recorded before it) stays on the message row (sent_response,
		// sent_started_at): no attempts row on the common path.
		attempts = append(attempts, "SELECT id, tenant, attempt, outcome, code, msg, resp, next, started FROM s_up WHERE NOT kept")
		applied = append(applied, "SELECT id FROM s_up")
	}
	if mask&finishRetry != 0 {
		ctes = append(ctes, `r_up AS (
	UPDATE {T} m SET status = 'PENDING', next_attempt_at = x.next, last_error_code = x.code,
		last_error_message = x.msg, updated_at = $1, claimed_at = NULL, claimed_by = NULL, claim_token = NULL
	FROM `+from("id, attempt, tok, next, code, msg, resp, started", "text[]", "int4[]", "text[]", "timestamptz[]", "text[]", "text[]", "text[]", "timestamptz[]")+`
	RETURNING m.id, m.tenant, x.attempt, 'RETRY'::text AS outcome, x.code, x.msg, x.resp, x.next, x.started
)`)
		attempts, applied = append(attempts, "SELECT * FROM r_up"), append(applied, "SELECT id FROM r_up")
	}
	if mask&finishDead != 0 {
		ctes = append(ctes, `d_up AS (
	UPDATE {T} m SET status = 'FAILED', last_error_code = x.code, last_error_message = x.msg,
		updated_at = $1, claimed_at = NULL, claimed_by = NULL, claim_token = NULL,
		-- a dead letter that holds its group (never one of group '')
		blocks_group = x.block AND m.grp <> ''
	FROM `+from("id, attempt, tok, code, msg, resp, started, block", "text[]", "int4[]", "text[]", "text[]", "text[]", "text[]", "timestamptz[]", "bool[]")+`
	RETURNING m.id, m.tenant, x.attempt, 'FAILED'::text AS outcome, x.code, x.msg, x.resp, NULL::timestamptz AS next, x.started
)`)
		attempts, applied = append(attempts, "SELECT * FROM d_up"), append(applied, "SELECT id FROM d_up")
	}
	woke := ""
	if mask&finishReleased != 0 {
		ctes = append(ctes, `l_up AS (
	UPDATE {T} m SET status = 'PENDING', attempts = m.attempts - 1, updated_at = $1,
		claimed_at = NULL, claimed_by = NULL, claim_token = NULL,
		next_attempt_at = coalesce(x.next, m.next_attempt_at),
		last_error_code = CASE WHEN x.haserr THEN x.code ELSE m.last_error_code END,
		last_error_message = CASE WHEN x.haserr THEN x.msg ELSE m.last_error_message END
	FROM `+from("id, attempt, tok, next, haserr, code, msg", "text[]", "int4[]", "text[]", "timestamptz[]", "bool[]", "text[]", "text[]")+`
	RETURNING m.id
)`, `woke AS (
	SELECT count(pg_notify($3, '')) AS n FROM (SELECT 1 FROM l_up LIMIT 1) x WHERE $3 <> ''
)`)
		applied = append(applied, "SELECT id FROM l_up")
		woke = " CROSS JOIN woke"
	} else {
		// $3 must appear in the statement for its type to be known.
		woke = " WHERE $3::text IS NOT NULL"
	}
	if len(attempts) > 0 {
		ctes = append(ctes, `att AS (
	INSERT INTO {A} (message_id, tenant, number, outcome, error_code, error_message,
		provider_response, next_attempt_at, started_at, finished_at)
	SELECT a.id, a.tenant, a.attempt, a.outcome, a.code, a.msg, a.resp::json, a.next, a.started, $1
	FROM (`+strings.Join(attempts, " UNION ALL ")+`) a
)`)
	}
	if len(ctes) == 0 {
		return `SELECT NULL::text WHERE $1::timestamptz IS NULL AND $2::text IS NULL AND $3::text IS NULL`
	}
	return "WITH " + strings.Join(ctes, ", ") + "\nSELECT a.id FROM (" + strings.Join(applied, " UNION ALL ") + ") a" + woke +
		"\nUNION ALL SELECT NULL::text WHERE {ASYNC} IS NULL"
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
