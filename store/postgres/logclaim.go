package postgres

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/outbox"
)

// The append-only hot path (issue #28, LOG-DESIGN.md): a claim inserts one
// lease mark per group run and an outcome one mark per run, instead of
// updating every message row twice. It runs when the store's logMode is
// set; until it covers every operation, only tests set it.

// logSettings pin the plans of the append-only path's statements, for
// their transaction only. JIT is the one that matters most: the
// candidates statement's estimated cost grows with the tables (its lateral
// lookups are costed per group from the statistics), and past
// jit_above_cost the server compiled it at every execution, 841 ms for 19
// ms of work two minutes into a run. Sorts are a last resort: a generic
// plan made while the marks were few found a group's latest mark through
// the marks' done index and a sort of every mark of the group (costed as
// one row), not a backward descent of their latest-mark index, and the
// take read 65,000
// buffers for 125 groups four minutes into a run.
const logSettings = `SELECT set_config('jit', 'off', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),
	set_config('plan_cache_mode', 'force_generic_plan', true)`

// Claim tuning. The log window reads between logWindowMin and logWindow
// messages from the floor (see logClaimState.window). At most every
// logMarginEvery, a claim's log and marks windows start logMargin back,
// from where the last such claim started, so a message or mark that
// committed after a later one was read is still found (a transaction that
// drew its sequence number first and committed last); the other claims
// read from the floor, so a claim's cost does not include the margin's
// rows.
// The backstop, which probes every registered group, runs at most every
// logBackstopMax and at least 50 times its own duration apart.
const (
	logWindow       = 3000
	logWindowMin    = 256
	logMargin       = 1000
	logMarginEvery  = 50 * time.Millisecond
	logBackstopMin  = time.Second
	logBackstopMax  = 30 * time.Second
	logDueMargin    = time.Second
	logClaimLockKey = 2 // the claims' and outcomes' advisory lock key space
)

// logClaimer is where this store's claims look next.
type logClaimer struct {
	mu sync.Mutex
	// claims holds where the claims of each topic set look next: a claim
	// of some topics reads only theirs, so its floor says nothing of the
	// others'.
	claims map[string]*logClaimState
	// recoverFrom is where lease recovery looks from (the last cutoff, less
	// logRecoverMargin).
	recoverFrom time.Time
	recoverAll  time.Time // when recovery last looked from the start
}

// logClaimState is where the claims of one topic set look next.
type logClaimState struct {
	mu       sync.Mutex
	floor    int64     // the log window starts after floor (see logMarginEvery)
	markSeen int64     // the last mark read
	dueFrom  time.Time // messages due after this (less logDueMargin) are found by time
	backstop time.Time // when the next backstop runs
	// xmin is the snapshot xmin (an xid8) of the claim that read up to
	// floor and markSeen (see logNewSince).
	xmin int64
	// ulow is where the backstop's scan of unordered messages starts.
	ulow int64
	// The last claim that read the margins: the floor and last mark it
	// started from, its snapshot's xmin, and when.
	mFloor, mMark, mXmin int64
	mAt                  time.Time
	// mWake is set while a wake-up is due for a claim that reads the
	// margins (see logClaim).
	mWake bool
	// fair is the tenant after which the next claim's fair share looks.
	fair string
	// run is the mean run (messages per group) of recent claims, 0 before
	// the first: a claim locks about twice the groups it needs at that
	// size, not every group in its windows.
	run float64
	// carry is the groups the last claim locked and did not lease: the
	// next claim looks at them first.
	carry []logGroupKey
	// window is how many messages the next claim's log window reads (0:
	// logWindow). It halves after a claim that found the groups it looked
	// for, and doubles after one that read its whole window without: its
	// cost is that window's rows, whatever the claim takes.
	window int
}

// state returns the claim state of the topic set key.
func (c *logClaimer) state(key string) *logClaimState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.claims[key]
	if !ok {
		if c.claims == nil {
			c.claims = map[string]*logClaimState{}
		}
		st = &logClaimState{}
		c.claims[key] = st
	}
	return st
}

// reset makes the next claims run the backstop (after an operator action
// that frees groups without a mark, such as removing a pause).
func (c *logClaimer) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.claims {
		st.mu.Lock()
		st.backstop = time.Time{}
		st.mu.Unlock()
	}
}

// logNewSince is whether a row (of the log or the marks) was written by a
// transaction that had not committed when the store's previous claim took
// its snapshot, whose xmin (epoch and all) is $12: only such rows of the
// windows' margins can be new to this store (a transaction that drew its
// sequence number before the floor passed it and committed after). The
// margins' other rows were read by an earlier claim, so their groups are
// not looked up again. xids are compared by age: a frozen row is old; a
// wraparound makes new rows look old for one comparison, and the backstop
// finds what that misses. $12 = 0: no previous claim.
const logNewSince = `($12 = 0 OR age(xmin) <= age(($12 % 4294967296)::text::xid))`

// logLatest is the latest mark of the group g (tenant, topic, grp, part), as
// a LATERAL subquery: one backward descent of the marks index.
const logLatest = `SELECT k.kind, k.done, k.upto, k.token, k.owner, k.at FROM {K} k
	WHERE k.gk = hashtextextended(g.tenant || chr(31) || g.topic || chr(31) || g.grp, 0) AND k.part = g.part
		AND k.tenant = g.tenant AND k.topic = g.topic AND k.grp = g.grp
	ORDER BY k.gk, k.part, k.mseq DESC LIMIT 1`

// logHead is the first waiting message after done of the group g (its
// PENDING messages and a dead letter that blocks it): for a group, one
// descent of the group index; for an unordered message (part = its seq),
// the message itself.
const logHead = `SELECT b.seq, b.status, b.next_attempt_at FROM {T} b
		WHERE g.part = 0 AND b.tenant = g.tenant AND b.topic = g.topic AND b.grp = g.grp
			AND (b.status = 'PENDING' OR b.blocks_group) AND b.grp <> '' AND b.seq > coalesce(k.done, 0)
		ORDER BY b.tenant, b.topic, b.grp, b.seq LIMIT 1`

// logCandidates finds the groups a claim may take, from append-only
// windows: the groups whose runs ended since $6 (done marks), whose
// messages came due by time since $7 (retries, deferred releases,
// scheduled messages) and that an earlier claim of this store carried
// ($16-$19), then the log after $5 ($4 messages) in order. It reads the
// groups' latest marks and first waiting messages lazily, in that order,
// until $10 claimable groups are found (idle, due, not paused, not held by
// a lease of the previous schema version), try-locking each as it is found
// (key space logClaimLockKey, namespace $9; a claim never waits, and
// passes a group another claim holds). The groups locked whose estimated
// runs (at most $3 each) fill $2 are returned for the take; the others
// locked are returned marked 1, to carry. Topics: $8 (NULL: all). Fair
// share adds, for each of the next 8 tenants after $11 with no message in
// the log window, its first claimable group. The first row carries
// whether the groups looked for were found (1) or the window was read
// whole without them (2), the next floor (before the first claimable group
// passed or left behind, before the first message enqueued after the
// claim's clock, and before the first group not read when the reading
// stopped early), the last mark read, and the tenant the next fair share
// starts after.
var logCandidates = `WITH RECURSIVE tn AS (
	-- Fair share: the tenants after $11 in the registry (a loose index
	-- scan, one descent each).
	(SELECT r.tenant FROM {G} r WHERE r.tenant > $11 ORDER BY r.tenant LIMIT 1)
	UNION ALL
	SELECT (SELECT r.tenant FROM {G} r WHERE r.tenant > tn.tenant ORDER BY r.tenant LIMIT 1) FROM tn WHERE tn.tenant IS NOT NULL
), tl AS MATERIALIZED (
	SELECT tenant FROM tn WHERE tenant IS NOT NULL LIMIT 8
), w0 AS MATERIALIZED (
	-- nd: the first message not due at $1 that has no time of its own (it
	-- was enqueued after the claim's clock read $1): the floor stays
	-- before it, as the due window finds only messages with a time of
	-- their own.
	SELECT tenant, topic, grp, part, min(seq) AS first, max(seq) AS last, count(*) AS n,
		min(seq) FILTER (WHERE next_attempt_at > $1 AND next_attempt_at <= created_at) AS nd FROM (
		SELECT seq, tenant, topic, grp, CASE WHEN grp = '' THEN seq ELSE 0 END AS part, next_attempt_at, created_at
		FROM {T} WHERE seq > $5 AND status = 'PENDING' AND claimed_by IS NULL AND ($8::text[] IS NULL OR topic = ANY($8::text[]))
			AND (seq > $13 OR ` + logNewSince + `)
		ORDER BY seq LIMIT $4) x
	GROUP BY tenant, topic, grp, part
), rm AS MATERIALIZED (
	SELECT tenant, topic, grp, part, max(mseq) AS mseq FROM {K}
	WHERE mseq > $6 AND kind = 'done' AND (mseq > $14 OR ` + logNewSince + `)
	GROUP BY tenant, topic, grp, part
), due AS MATERIALIZED (
	SELECT DISTINCT tenant, topic, grp, CASE WHEN grp = '' THEN seq ELSE 0 END AS part FROM {T}
	WHERE status = 'PENDING' AND next_attempt_at > created_at AND claimed_by IS NULL AND next_attempt_at > $7 AND next_attempt_at <= $1
), fg AS MATERIALIZED (
	-- Fair share: for each of those tenants that has no message in the
	-- log window, its first claimable group, so a tenant's message is not
	-- left behind another tenant's backlog.
	SELECT f.tenant, f.topic, f.grp, f.part FROM tl CROSS JOIN LATERAL (
		SELECT g.tenant, g.topic, g.grp, g.part FROM (
			SELECT r.tenant, r.topic, r.grp, 0::bigint AS part FROM {G} r
			WHERE r.tenant = tl.tenant AND ($8::text[] IS NULL OR r.topic = ANY($8::text[]))) g
		LEFT JOIN LATERAL (` + logLatest + `) k ON true
		CROSS JOIN LATERAL (` + logHead + `) h
		WHERE (k.kind IS NULL OR k.kind = 'done') AND h.status = 'PENDING' AND h.next_attempt_at <= $1
		LIMIT 1) f
	WHERE NOT EXISTS (SELECT 1 FROM w0 WHERE w0.tenant = tl.tenant)
), w AS MATERIALIZED (
	-- A run's length is not known here: an unordered message's is 1, a
	-- group's is taken as the mean run of recent claims ($15), or what the
	-- log window holds of it when that is more (the window sees only a
	-- part of a long backlog).
	SELECT tenant, topic, grp, part, first, last, CASE WHEN part > 0 THEN 1 ELSE greatest(n, $15) END AS n FROM w0
	UNION ALL
	SELECT o.tenant, o.topic, o.grp, o.part, 0, 0, CASE WHEN o.part > 0 THEN 1 ELSE $15 END FROM (
		SELECT tenant, topic, grp, part FROM rm UNION SELECT tenant, topic, grp, part FROM due
		UNION SELECT tenant, topic, grp, part FROM fg
		-- Groups this store locked in an earlier claim and did not lease
		-- (the take reached the claim's limit first): a concurrent claim
		-- that found them locked passed them.
		UNION SELECT * FROM unnest($16::text[], $17::text[], $18::text[], $19::int8[])) o
	WHERE ($8::text[] IS NULL OR o.topic = ANY($8::text[]))
		AND NOT EXISTS (SELECT 1 FROM w0 WHERE w0.tenant = o.tenant AND w0.topic = o.topic AND w0.grp = o.grp AND w0.part = o.part)
), e AS MATERIALIZED (
	-- The first $10 claimable groups in order, each try-locked as it is
	-- read (a volatile column: the rows stream, nothing sorts them after
	-- it). A group another claim holds is passed; the floor stays before
	-- it.
	SELECT * FROM (
		SELECT y.*, pg_try_advisory_xact_lock($9::int4, hashtext(y.tenant || chr(31) || y.topic || chr(31) || y.grp || chr(31) || y.part)) AS got FROM (
			SELECT g.tenant, g.topic, g.grp, g.part, g.first, g.n, h.seq AS head
			FROM (SELECT * FROM w ORDER BY first) g
			LEFT JOIN LATERAL (` + logLatest + `) k ON true
			LEFT JOIN LATERAL (` + logHead + `) hg ON true
			LEFT JOIN LATERAL (SELECT b.seq, b.status, b.next_attempt_at FROM {T} b
				WHERE g.part > 0 AND b.seq = g.part AND b.status = 'PENDING' AND b.claimed_by IS NULL AND b.seq > coalesce(k.done, 0) LIMIT 1) hu ON true
			CROSS JOIN LATERAL (SELECT coalesce(hg.seq, hu.seq) AS seq, coalesce(hg.status, hu.status) AS status,
				coalesce(hg.next_attempt_at, hu.next_attempt_at) AS next_attempt_at) h
			WHERE (k.kind IS NULL OR k.kind = 'done') AND h.status = 'PENDING' AND h.next_attempt_at <= $1
				AND (NOT EXISTS (SELECT 1 FROM {P}) OR ` + strings.TrimPrefix(strings.ReplaceAll(adminsql.NotPausedRowByRow("{P}", "g."), "\n", " "), " AND ") + `)
				AND (g.part > 0 OR NOT EXISTS (SELECT 1 FROM {T} l WHERE l.tenant = g.tenant AND l.topic = g.topic
					AND l.grp = g.grp AND l.status = 'PROCESSING'))
			ORDER BY g.first) y) z
	LIMIT $10
), c AS MATERIALIZED (
	SELECT e.*, sum(least(e.n, $3)) OVER (ORDER BY e.first ROWS UNBOUNDED PRECEDING) - least(e.n, $3) AS before FROM e WHERE e.got
), l AS MATERIALIZED (
	-- The groups whose runs the take reads (the others' locks go at the
	-- commit): as many as the estimated runs need to fill the claim.
	SELECT c.tenant, c.topic, c.grp, c.part, c.first, c.head FROM c WHERE c.before < $2
)
SELECT NULL::text, NULL::text, NULL::text,
	-- 1: the groups looked for were found; 2: the log window was read
	-- whole without finding them.
	CASE WHEN (SELECT count(*) FROM e) >= $10 THEN 1 WHEN (SELECT sum(n) FROM w0) >= $4 THEN 2 ELSE 0 END::bigint,
	coalesce(least(
		(SELECT min(c.head) - 1 FROM c WHERE c.first > 0 AND c.before >= $2),
		(SELECT min(e.head) - 1 FROM e WHERE e.first > 0 AND NOT e.got),
		(SELECT min(nd) - 1 FROM w0),
		CASE WHEN (SELECT count(*) FROM e) >= $10 THEN (SELECT max(first) FROM e) ELSE (SELECT max(last) FROM w0) END),
		$5),
	(SELECT max(mseq) FROM rm),
	CASE WHEN (SELECT count(*) FROM tl) = 8 THEN (SELECT max(tenant) FROM tl) ELSE '' END,
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint
UNION ALL
(SELECT tenant, topic, grp, part, NULL, NULL, NULL, NULL FROM l ORDER BY first)
UNION ALL
-- Locked, but past what the claim needs: carried to the next claim.
SELECT tenant, topic, grp, part, 1, NULL, NULL, NULL FROM c WHERE c.before >= $2`

// logBackstop is the first waiting message of every registered group, one
// probe per group, and the first unordered message after $1 without a
// done mark, and the last seq of the log window's index: what the windows may have passed (a
// transaction that drew its sequence number before the floor moved past
// it and committed after). Its cost follows the number of groups and the
// unordered messages since $1, not the log's length.
const logBackstop = `SELECT
	(SELECT min(h.seq) FROM (SELECT tenant, topic, grp, 0::bigint AS part FROM {G}) g
		LEFT JOIN LATERAL (` + logLatest + `) k ON true
		CROSS JOIN LATERAL (` + logHead + `) h),
	(SELECT min(u.seq) FROM {T} u WHERE u.grp = '' AND u.status = 'PENDING' AND u.claimed_by IS NULL AND u.seq > $1
		AND NOT EXISTS (SELECT 1 FROM {K} k WHERE k.gk = hashtextextended(u.tenant || chr(31) || u.topic || chr(31) || '', 0) AND k.part = u.seq
			AND k.tenant = u.tenant AND k.topic = u.topic AND k.grp = '' AND k.kind = 'done')),
	-- The log's end, from the log window's index (a descent; the table
	-- has no index on seq over every row).
	(SELECT max(seq) FROM {T} WHERE status = 'PENDING' AND claimed_by IS NULL)`

// logUnorderedLookback is how far behind the log's end the backstop's
// scan of unordered messages starts when it found none waiting: a
// transaction whose unordered message commits after this many later
// messages were enqueued is found by the log window's margin only if it
// is within it.
const logUnorderedLookback = 100_000

// logTake leases the locked groups' next runs (at most $3 each, $9 in all)
// to owner $2 under token $4 at $1, after reading their marks again (the
// locks were taken by the statement before, so this statement's snapshot
// holds every mark committed under them), and returns the messages as
// claimed. It fills the groups whole, in the order given (the candidates'
// oldest first), and reads no further once $9 messages are found: a run
// is cut only at the claim's limit, so each claim writes as few marks, and
// the next claims look up as few groups, as the backlog allows.
const logTake = `WITH s AS MATERIALIZED (
	SELECT g.ord, g.tenant, g.topic, g.grp, g.part, coalesce(k.done, 0) AS done
	FROM unnest($5::text[], $6::text[], $7::text[], $8::int8[]) WITH ORDINALITY AS g(tenant, topic, grp, part, ord)
	LEFT JOIN LATERAL (` + logLatest + `) k ON true
	WHERE k.kind IS NULL OR k.kind = 'done'
), r AS (
	SELECT s.ord, s.tenant, s.topic, s.grp, s.part, s.done, x.ctid, x.seq
	FROM (SELECT * FROM s ORDER BY s.ord) s CROSS JOIN LATERAL (
		SELECT y.ctid, y.seq FROM (
			SELECT b.ctid, b.seq, bool_and(b.status = 'PENDING' AND b.next_attempt_at <= $1) OVER (ORDER BY b.seq) AS ok
			FROM {T} b
			WHERE s.part = 0 AND b.tenant = s.tenant AND b.topic = s.topic AND b.grp = s.grp
				AND (b.status = 'PENDING' OR b.blocks_group) AND b.grp <> '' AND b.seq > s.done
			ORDER BY b.tenant, b.topic, b.grp, b.seq LIMIT $3) y
		WHERE y.ok
		UNION ALL
		SELECT b.ctid, b.seq FROM {T} b
		WHERE s.part > 0 AND b.seq = s.part AND b.seq > s.done AND b.status = 'PENDING' AND b.claimed_by IS NULL AND b.next_attempt_at <= $1
	) x
	ORDER BY s.ord, x.seq
), rk AS MATERIALIZED (
	SELECT * FROM r LIMIT $9
), ins AS (
	INSERT INTO {K} (tenant, topic, grp, part, kind, done, upto, token, owner, at)
	SELECT tenant, topic, grp, part, 'lease', done, max(seq), $4::uuid, $2, $1 FROM rk
	GROUP BY tenant, topic, grp, part, done
)
SELECT {CLAIMED} FROM rk r JOIN {T} m ON m.ctid = r.ctid ORDER BY m.seq`

// claimedCols is msgCols of the row m as a claim returns it: PROCESSING,
// its attempt counted, claimed by $2 at $1 under token $4.
func claimedCols() string {
	over := map[string]string{
		"status":      "'PROCESSING'::text",
		"attempts":    "m.attempts + 1",
		"updated_at":  "$1::timestamptz",
		"claimed_at":  "$1::timestamptz",
		"claimed_by":  "$2::text",
		"claim_token": "$4::uuid",
	}
	cols := strings.Split(msgCols, ",")
	for i, c := range cols {
		c = strings.TrimSpace(c)
		if v, ok := over[c]; ok {
			cols[i] = v
		} else {
			cols[i] = "m." + c
		}
	}
	return strings.Join(cols, ", ")
}

// logClaim is MessageClaim on the append-only path.
func (s *Store) logClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	var topics []string
	if len(p.Topics) > 0 {
		topics = texts(p.Topics)
	}
	c := s.logc.state(strings.Join(topics, "\x00"))
	if err := s.logMaybeBackstop(ctx, c); err != nil {
		return nil, wrapErr("claim", err)
	}
	in := c.next(p.Limit, min(s.opts.ClaimPerGroup, p.Limit))
	res, err := s.logClaimTx(ctx, p, topics, in)
	if err != nil {
		c.mu.Lock()
		c.carry = append(c.carry, in.carried...)
		c.mu.Unlock()
		return nil, wrapErr("claim", err)
	}
	s.logKnown.add(res.msgs)
	s.logReg.add(res.msgs)
	c.settle(s, p, in, res)
	return res.msgs, nil
}

// logMaybeBackstop runs the backstop when it is due, and moves c's floor
// back to the first waiting message it found.
func (s *Store) logMaybeBackstop(ctx context.Context, c *logClaimState) error {
	c.mu.Lock()
	due := time.Now().After(c.backstop)
	ulow := c.ulow
	c.mu.Unlock()
	if !due {
		return nil
	}
	began := time.Now()
	var gmin, umin, last *int64
	if err := s.logTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.lsql.logBackstop, ulow).Scan(&gmin, &umin, &last)
	}); err != nil {
		return err
	}
	took := time.Since(began)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case gmin != nil && umin != nil:
		c.floor = min(*gmin, *umin) - 1
	case gmin != nil:
		c.floor = *gmin - 1
	case umin != nil:
		c.floor = *umin - 1
	}
	switch {
	case umin != nil:
		c.ulow = *umin - 1
	case last != nil:
		c.ulow = max(c.ulow, *last-logUnorderedLookback)
	}
	// The marks and due windows go on where they were: reading them
	// from the start would cost every mark and retry ever written.
	c.backstop = time.Now().Add(min(max(50*took, logBackstopMin), logBackstopMax))
	return nil
}

// logClaimIn is what a claim reads from its logClaimState before it runs.
type logClaimIn struct {
	run                  int   // the most messages of one group
	from, markSeen       int64 // where the log window and the marks window start
	floor, markTop, xmin int64 // the state those were read in (see logNewSince)
	dueFrom              time.Time
	margin               bool // this claim reads the margins
	fairFrom             string
	runGuess             int64
	groupsCap, window    int
	carried              []logGroupKey
	cts, cps, cgs        []string // carried, as arrays
	cparts               []int64
}

// next returns what the next claim of limit messages, at most run per
// group, starts from, and takes the carried groups.
func (c *logClaimState) next(limit, run int) logClaimIn {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := logClaimIn{run: run, from: c.floor, markSeen: c.markSeen, dueFrom: c.dueFrom.Add(-logDueMargin),
		floor: c.floor, markTop: c.markSeen, xmin: c.xmin, fairFrom: c.fair}
	in.margin = time.Since(c.mAt) >= logMarginEvery
	if in.margin {
		in.from, in.markSeen, in.xmin = max(min(c.mFloor, in.floor)-logMargin, 0), max(min(c.mMark, in.markTop)-logMargin, 0), c.mXmin
	}
	in.runGuess = int64(min(max(math.Ceil(c.run), 1), float64(run)))
	in.groupsCap = 2 * limit
	if c.run > 1 {
		in.groupsCap = min(max(int(2*float64(limit)/c.run)+16, 16), in.groupsCap)
	}
	in.carried, c.carry = c.carry, nil
	in.window = c.window
	if in.window == 0 {
		in.window = logWindow
	}
	for _, g := range in.carried {
		in.cts, in.cps, in.cgs, in.cparts = append(in.cts, g.tenant), append(in.cps, g.topic), append(in.cgs, g.grp), append(in.cparts, g.part)
	}
	return in
}

// logClaimOut is what a claim's transaction returns.
type logClaimOut struct {
	msgs      []outbox.Message
	taken     []logGroupKey // the groups the take read, in order
	carry     []logGroupKey // locked, not read: for the next claim
	found     int64         // the candidates' header column 4
	nextFloor *int64
	lastMark  *int64
	nextFair  *string
	snapXmin  *int64
}

// logClaimTx runs a claim's two statements in one transaction: the
// candidates (which try-lock the groups) and the take (which leases their
// runs). On a pool it sends them in two round trips (logClaimPiped).
func (s *Store) logClaimTx(ctx context.Context, p outbox.MessageClaimParams, topics []string, in logClaimIn) (logClaimOut, error) {
	var token pgtype.UUID
	if err := token.Scan(outbox.NewClaimToken()); err != nil {
		return logClaimOut{}, err
	}
	now := s.at(p.Now)
	cargs := []any{now, p.Limit, in.run, in.window, in.from, in.markSeen, in.dueFrom, topics,
		s.groupNS + logClaimLockKey, in.groupsCap, in.fairFrom, in.xmin, in.floor, in.markTop, in.runGuess, in.cts, in.cps, in.cgs, in.cparts}
	takeArgs := func(g logTakeGroups) []any {
		return []any{now, text(p.Owner), in.run, token, g.ts, g.ps, g.gs, g.parts, p.Limit}
	}
	if a, ok := s.db.(acquirer); ok {
		return s.logClaimPiped(ctx, a, cargs, takeArgs)
	}
	var out logClaimOut
	err := s.logTx(ctx, func(tx pgx.Tx) error {
		out = logClaimOut{}
		rows, err := tx.Query(ctx, s.lsql.logCandidates, cargs...)
		if err != nil {
			return err
		}
		g, err := out.readCandidates(rows)
		if err != nil || len(g.gs) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, s.lsql.logTake, takeArgs(g)...)
		if err != nil {
			return err
		}
		return out.readTaken(rows)
	})
	return out, err
}

// logClaimPiped is logClaimTx on a connection of its own, in two round
// trips instead of five: BEGIN, the settings and the candidates go in one
// batch, the take and COMMIT in another. A claim is on the path from an
// enqueue's commit to its publication. A statement that fails leaves the
// transaction aborted: it is rolled back (a connection that cannot is
// closed by the pool, which never lends one inside a transaction).
func (s *Store) logClaimPiped(ctx context.Context, a acquirer, cargs []any, takeArgs func(logTakeGroups) []any) (out logClaimOut, err error) {
	p, br, err := s.logPipeBegin(ctx, a, func(b *pgx.Batch) { b.Queue(s.lsql.logCandidates, cargs...) })
	if err != nil {
		return logClaimOut{}, err
	}
	defer func() { p.end(ctx, err) }()
	conn := p.c.Conn()
	var g logTakeGroups
	var rows pgx.Rows
	if rows, err = br.Query(); err == nil {
		g, err = out.readCandidates(rows)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return logClaimOut{}, err
	}
	if len(g.gs) == 0 {
		_, err = conn.Exec(ctx, "COMMIT")
		p.began = err != nil
		return out, err
	}
	b := &pgx.Batch{}
	b.Queue(s.lsql.logTake, takeArgs(g)...)
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	if rows, err = br.Query(); err == nil {
		if err = out.readTaken(rows); err == nil {
			_, err = br.Exec()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return logClaimOut{}, err
	}
	p.began = false
	return out, nil
}

// logPipe is a transaction of the append-only path on a connection of its
// own, whose statements go in batches: BEGIN and the settings with the
// first ones, COMMIT with the last (logClaimPiped, logFinishPiped).
type logPipe struct {
	c     *pgxpool.Conn
	began bool // BEGIN ran and no COMMIT yet
}

// logPipeBegin acquires a connection and sends BEGIN, the settings and the
// statements queue adds in one batch. It returns the batch's results from
// queue's first statement on; the caller closes them, and calls end.
func (s *Store) logPipeBegin(ctx context.Context, a acquirer, queue func(*pgx.Batch)) (*logPipe, pgx.BatchResults, error) {
	c, err := a.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	p := &logPipe{c: c}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(s.logSettings())
	queue(b)
	br := c.Conn().SendBatch(ctx, b)
	if _, err = br.Exec(); err == nil {
		p.began = true
		_, err = br.Exec()
	}
	if err != nil {
		_ = br.Close()
		p.end(ctx, err)
		return nil, nil, err
	}
	return p, br, nil
}

// end rolls the transaction back when err is set and it began (a
// connection that cannot is closed by the pool, which never lends one
// inside a transaction), and gives the connection back.
func (p *logPipe) end(ctx context.Context, err error) {
	if err != nil && p.began {
		_, _ = p.c.Conn().Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	p.c.Release()
}

// logTakeGroups is the groups the take reads, as its arrays.
type logTakeGroups struct {
	ts, ps, gs []string
	parts      []int64
}

// readCandidates reads the candidates' rows into out (the header, the
// groups to carry and the groups taken, in order) and returns the taken
// groups as the take's arrays. It closes rows.
func (out *logClaimOut) readCandidates(rows pgx.Rows) (logTakeGroups, error) {
	defer rows.Close()
	var g logTakeGroups
	for rows.Next() {
		var t, tp, gr, ft *string
		var part, f, mk, xm *int64
		if err := rows.Scan(&t, &tp, &gr, &part, &f, &mk, &ft, &xm); err != nil {
			return logTakeGroups{}, err
		}
		switch {
		case gr == nil:
			out.nextFloor, out.lastMark, out.nextFair, out.snapXmin = f, mk, ft, xm
			out.found = *part
		case f != nil:
			out.carry = append(out.carry, logGroupKey{tenant: *t, topic: *tp, grp: *gr, part: *part})
		default:
			out.taken = append(out.taken, logGroupKey{tenant: *t, topic: *tp, grp: *gr, part: *part})
			g.ts, g.ps, g.gs, g.parts = append(g.ts, *t), append(g.ps, *tp), append(g.gs, *gr), append(g.parts, *part)
		}
	}
	return g, rows.Err()
}

// readTaken reads the take's messages into out. It closes rows.
func (out *logClaimOut) readTaken(rows pgx.Rows) error {
	defer rows.Close()
	for rows.Next() {
		m, err := scanMessage(rows)
		if err != nil {
			return err
		}
		out.msgs = append(out.msgs, m)
	}
	return rows.Err()
}

// settle records a claim's result in c: the groups to carry, the window's
// size, the mean run, the floor and the marks read, and the margins'
// wake-up.
func (c *logClaimState) settle(s *Store, p outbox.MessageClaimParams, in logClaimIn, out logClaimOut) {
	// The take fills the groups whole, in order, up to the claim's limit:
	// the groups after the last it filled got nothing, and are carried;
	// the last one's run may be cut, so the mean run counts the others.
	filled := make(map[logGroupKey]int, len(out.taken))
	for _, m := range out.msgs {
		filled[logKeyOf(m)]++
	}
	carry := out.carry
	var runs, inRuns int
	for i, g := range out.taken {
		n, ok := filled[g]
		switch {
		case !ok:
			carry = append(carry, g)
		case len(out.msgs) < p.Limit || i+1 < len(out.taken) && filled[out.taken[i+1]] > 0 || len(filled) == 1:
			runs, inRuns = runs+1, inRuns+n
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.carry = append(c.carry, carry...)
	switch out.found {
	case 1:
		c.window = max(in.window/2, logWindowMin)
	case 2:
		c.window = min(in.window*2, logWindow)
	}
	if runs > 0 {
		r := float64(inRuns) / float64(runs)
		if c.run == 0 {
			c.run = r
		}
		c.run = 0.8*c.run + 0.2*r
	}
	// The floor, the last mark read and the snapshot they were read in
	// are one state (see logNewSince): each claim's is valid, so the last
	// claim's is kept, even behind a concurrent claim's (that reads more).
	if out.nextFloor != nil && out.snapXmin != nil {
		c.floor, c.xmin = *out.nextFloor, *out.snapXmin
		if out.lastMark != nil {
			c.markSeen = max(*out.lastMark, in.markTop)
		}
		if in.margin {
			c.mFloor, c.mMark, c.mXmin, c.mAt = in.floor, in.markTop, *out.snapXmin, time.Now()
		}
	}
	if !in.margin && !c.mWake {
		// A message that committed late, after this claim passed it, is
		// found by the next claim that reads the margins. Without a
		// wake-up, the last ones of a burst would wait for the poll
		// interval: the processors are woken when such a claim is due.
		c.mWake = true
		time.AfterFunc(max(logMarginEvery-time.Since(c.mAt), 0)+time.Millisecond, func() {
			c.mu.Lock()
			c.mWake = false
			c.mu.Unlock()
			s.wakers.wakeAll()
		})
	}
	if out.nextFair != nil {
		c.fair = *out.nextFair
	}
	if now := s.at(p.Now); now.After(c.dueFrom) {
		c.dueFrom = now
	}
}

// logTx runs fn in a transaction with logSettings, committed when fn
// returns nil. With Options.AsyncCommit it commits without waiting for its
// WAL flush (claims, outcomes, recovery; see logDurableTx).
func (s *Store) logTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.logTxWith(ctx, s.logSettings(), fn)
}

// logSettings is logSettings with Options.AsyncCommit's.
func (s *Store) logSettings() string {
	if s.opts.AsyncCommit {
		return logSettings + ", set_config('synchronous_commit', 'off', true)"
	}
	return logSettings
}

// logDurableTx is logTx that always waits for its commit's WAL flush
// (operator actions).
func (s *Store) logDurableTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.logTxWith(ctx, logSettings, fn)
}

func (s *Store) logTxWith(ctx context.Context, settings string, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, settings); err != nil {
			return err
		}
		return fn(tx)
	})
}
