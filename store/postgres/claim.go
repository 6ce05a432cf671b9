package postgres

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/outbox"
)

// claimTimeout bounds a claim, which does not stop when its caller's
// context ends (see MessageClaim).
const claimTimeout = 30 * time.Second

// MaxClaimLimit is the largest MessageClaimParams.Limit the store accepts.
const MaxClaimLimit = outbox.MaxClaimLimit

// MessageClaim leases up to p.Limit due messages to p.Owner in one statement
// (one round trip in the common case) and returns them ordered by Seq.
//
// FIFO per group holds with any number of concurrent claimers: a message is
// claimed only when every earlier unfinished message of its group is
// claimed in the same call. A group whose earlier message is PROCESSING,
// waiting for a retry (PENDING, not due), or row-locked by a concurrent
// claim is skipped as a whole. Claims use FOR UPDATE SKIP LOCKED, so
// claimers never wait for each other.
//
// The claim looks for group heads among the oldest pending messages (a
// window of 4 x Limit, at least 1,000 and at most 20,000). When that window
// is full and yields fewer than Limit messages (long backlogs behind groups
// that are blocked), a second statement visits every group with unfinished
// messages, so no group starves behind blocked ones. The window starts a
// margin (the sequence numbers drawn in about a second, from 1,000 to
// 10,000) before the first pending message the Store saw last (when there
// was none, from the largest sequence number its claims saw), and from the very first pending message once a second has passed
// since a claim last read it from there (longer when such a read is dear:
// see windowRescan): a message that becomes PENDING again far behind the
// backlog's front (a retry coming due, a release, a recovered lease, a
// resumed pause) may wait up to a second longer to be claimed, and up to
// 30 seconds while a transaction holds the cleanup horizon for long.
//
// The lookups of a group's first waiting and first leased message start at
// the group's floor, when this store knows one (see groupFloors), so that
// they do not walk the index entries its finished messages left.
//
// ctx is checked before the claim starts; once started, the claim runs to
// completion (at most 30 s) even if ctx ends, and returns the messages it
// leased: a claim committed by the server but abandoned by the client would
// leave its messages leased until recovery.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// A claim commits on the server in one statement: if ctx ended while it
	// ran, the client would lose messages the server leased (they would wait
	// for lease recovery). So ctx is checked before the claim starts, and
	// the claim then runs to completion (bounded by claimTimeout) and
	// returns what it leased; the caller releases what it will not publish.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	if s.logMode {
		return s.logClaim(ctx, p)
	}
	now := s.at(p.Now)
	owner := text(p.Owner)
	budget := min(max(4*p.Limit, 1000), 20000)
	run := min(s.opts.ClaimPerGroup, p.Limit)

	key := strings.Join(p.Topics, "\x00")
	floors := s.floors.json()
	// Fair share first (see fairShare): a few heads of other tenants, so a
	// burst of one tenant does not hold the others back.
	// extra: what statements other than the window's claimed (the fair
	// share's, the fallback's), merged into the window's in Seq order.
	extra, err := s.claimFair(ctx, key, p, now, owner, run, floors)
	if err != nil {
		return nil, err
	}
	limit := p.Limit - len(extra)
	if limit == 0 {
		s.fair.claimed(key, true)
		return extra, nil
	}
	stmt, fb := s.sql.claimAll, s.sql.claimFallbackAll
	low, full := s.windows.start(key, time.Now())
	args := []any{now, owner, limit, budget, run, low, floors}
	if len(p.Topics) > 0 {
		stmt, fb = s.sql.claimTopics, s.sql.claimFallbackTopics
		args = append(args, p.Topics)
	}
	settings := planSettings
	if s.smallClaims.Load() {
		settings = claimSettings
	}
	began := time.Now()
	msgs, win, err := s.claim(ctx, settings, stmt, args)
	if err != nil {
		if len(extra) > 0 {
			// The fair-share claim is committed: hand it out rather than
			// leave it to lease recovery.
			s.log.WarnContext(ctx, "outboxkit/postgres: claim failed after the fair-share claim", "err", err)
			return extra, nil
		}
		return nil, err
	}
	took := time.Since(began)
	s.sawServer(win.server)
	last := win.maxSeq
	if len(msgs) > 0 {
		last = max(last, msgs[len(msgs)-1].Seq)
	}
	s.windows.saw(key, win.minSeq, last, full, took)
	s.floors.claimed(msgs)
	s.smallClaims.Store(len(msgs) < smallClaim)
	if len(msgs) < limit && win.scanned >= int64(budget) {
		fbArgs := []any{now, owner, limit - len(msgs), win.maxSeq, run}
		if len(p.Topics) > 0 {
			fbArgs = append(fbArgs, p.Topics)
		}
		more, _, err := s.claim(ctx, planSettings, fb, fbArgs)
		if err != nil {
			// The first claim is committed: hand it out rather than leave
			// it to lease recovery.
			s.log.WarnContext(ctx, "outboxkit/postgres: fallback claim failed", "err", err)
		}
		extra = append(extra, more...)
	}
	s.fair.claimed(key, len(msgs)+len(extra) >= p.Limit)
	if len(extra) > 0 {
		msgs = append(msgs, extra...)
		sort.Slice(msgs, func(i, j int) bool { return msgs[i].Seq < msgs[j].Seq })
	}
	return msgs, nil
}

// window is what a claim read of its window: how many rows (when the
// claim was not filled, else 0), the last sequence number of those, and
// the first (0 when the window was empty).
//
// server names the server that ran the claim (its start time): the
// store's floors and windows hold only for the server they were learned
// on.
type window struct {
	scanned, maxSeq, minSeq int64
	server                  string
}

func (s *Store) claim(ctx context.Context, settings, stmt string, args []any) ([]outbox.Message, window, error) {
	var (
		msgs []outbox.Message
		win  window
		tid  *string
	)
	err := s.plannedWith(ctx, settings, stmt, args, func(r pgx.Rows) error {
		var row msgRow
		if r.RawValues()[4] == nil { // no message claimed: only the window's figures
			dest := make([]any, 5+len(row.dest()))
			dest[0], dest[1], dest[2], dest[3] = &win.scanned, &win.maxSeq, &win.minSeq, &win.server
			return r.Scan(dest...)
		}
		dest := append([]any{&win.scanned, &win.maxSeq, &win.minSeq, &win.server}, row.dest()...)
		if err := r.Scan(append(dest, &tid)...); err != nil {
			return err
		}
		m, err := row.message()
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
		if tid != nil {
			s.tids.put(m.ID, *tid)
		}
		return nil
	})
	if err != nil {
		return msgs, window{}, wrapErr("claim", err)
	}
	return msgs, win, nil
}

// Where a claim's window starts. The claim index holds an entry for every
// message that was PENDING since the last vacuum: the entries of claimed
// and finished messages stay, in sequence order, before the pending ones,
// and a window read from the start walks them all (at 500,000 drained
// messages, with autovacuum off, more than a page of them per claimed
// message). So a claim starts its window a margin (see windowMarginMin)
// before the first pending message the store saw last, and reads it from
// the start again once windowRescan has passed since it last did.
//
// A window read from the start that was empty (nothing pending: a drained
// backlog, an idle store) starts the next ones windowMargin before the
// sequence number after the largest one the store's claims saw, not from
// the start: otherwise every claim of a trickle, each one after a claim
// that took everything, would walk the whole index again.
//
// What it may not see until then: a message that became PENDING again
// after its group's later messages were seen (a retry that came due, a
// release, a recovered lease, an admin retry) or that was committed late
// (its transaction drew its sequence number more than the margin earlier). Order is not at stake: a group's later messages wait for their
// head whether or not the window sees it.
//
// How long "until then" is: windowRescan, or rescanCost times as long as
// the last read from the start took, whichever is longer, and never more
// than windowRescanMax. A read from the start walks the index entries of
// every message claimed since the last vacuum; while a transaction holds
// the cleanup horizon nothing removes them, and after minutes of such a
// hold one read from the start costs as much as thousands of claims. Spacing
// the reads by their cost keeps them to a few percent of the claims' work,
// at the price of a later look behind the window while the horizon is held.
//
// The margin itself is the sequence numbers drawn in the last second or so
// (as claims saw them), at least windowMarginMin and at most windowMargin:
// what a transaction that commits a second after it drew its numbers is
// behind by. Its entries before the first pending message are those of
// messages claimed since, which a window walks (and, while the cleanup
// horizon is held, visits each in the table).
const (
	windowMargin    = 10_000
	windowMarginMin = 1_000
	windowRescan    = time.Second
	windowRescanMax = 30 * time.Second
	rescanCost      = 20
)

// windowLows keeps, per topic filter, the first pending sequence number a
// claim saw and when a claim last read its window from the start.
type windowLows struct {
	mu     sync.Mutex
	lows   map[string]windowLow
	margin int64         // windowMargin; tests set less
	rescan time.Duration // windowRescan; tests set less
}

type windowLow struct {
	seq  int64         // first pending sequence number seen, 0 for none
	high int64         // the largest sequence number a claim saw, 0 for none
	full time.Time     // when the last window read from the start began
	took time.Duration // how long the claim of the last read from the start took
	// The sequence numbers drawn per second, from the largest one claims
	// saw (rateHigh at rateAt, a second or more before).
	perSec   int64
	rateHigh int64
	rateAt   time.Time
}

// rescanAfter is how long after a read from the start the next one is due.
func (w *windowLows) rescanAfter(l windowLow) time.Duration {
	return min(max(w.rescan, rescanCost*l.took), max(w.rescan, windowRescanMax))
}

// start returns where the window of a claim with topic filter key, made
// at now (the wall clock, whatever the claim's Now), starts: 0 and full
// when it reads from the start.
func (w *windowLows) start(key string, now time.Time) (low int64, full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l, ok := w.lows[key]
	if !ok || l.seq == 0 || now.Sub(l.full) >= w.rescanAfter(l) || now.Before(l.full) {
		if w.lows == nil {
			w.lows = map[string]windowLow{}
		}
		// Read from the start: stamped now, when the claim's snapshot
		// is not yet taken.
		l.full = now
		w.lows[key] = l
		return 0, true
	}
	return max(l.seq-min(w.margin, max(l.perSec, windowMarginMin)), 0), false
}

// reset forgets every window's start: the next claims read from the start.
func (w *windowLows) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lows = map[string]windowLow{}
}

// saw records the first sequence number of a claim's window (0 when it
// was empty) and the largest one the claim saw (its window's or its
// messages'): from a window read from the start the first replaces the
// last one, and an empty one is replaced by the number after the largest
// seen so far (nothing before it was pending); from a later window only a
// larger first does (the window saw no earlier one past its start). took
// is how long the claim took.
func (w *windowLows) saw(key string, first, last int64, full bool, took time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.lows[key]
	l.high = max(l.high, last)
	if full {
		l.took = took
	}
	if now := time.Now(); l.rateAt.IsZero() || now.Before(l.rateAt) {
		l.rateHigh, l.rateAt = l.high, now
	} else if d := now.Sub(l.rateAt); d >= time.Second {
		l.perSec = int64(float64(l.high-l.rateHigh) / d.Seconds())
		l.rateHigh, l.rateAt = l.high, now
	}
	if full && first == 0 && l.high > 0 {
		first = l.high + 1
	}
	if full || first > l.seq {
		l.seq = first
	}
	w.lows[key] = l
}

// sawServer records the server a claim ran on. On another server than the
// last one (a failover to a standby, a restore, a restart) the floors and
// the windows' starts learned so far are dropped: the new server may draw
// sequence numbers again below them (an asynchronous standby that had not
// received the last ones), and a window or floor past a new message would
// hide it.
func (s *Store) sawServer(server string) {
	if server != "" && s.floors.onServer(server) {
		s.windows.reset()
	}
}

// waiting is the group index's predicate (see migration 11) for the
// rows aliased a: a group's PENDING messages and the dead letters that
// block it.
func waiting(a string) string {
	return "(" + a + ".status = 'PENDING' OR " + a + ".blocks_group) AND " + a + ".grp <> ''"
}

// firstLeased is the seq of the first leased (PROCESSING) message of the
// group of the row aliased a, or the largest bigint when none is: one
// descent of the lease index. With a floor (an expression: see
// groupFloors), the descent starts at it.
func firstLeased(a, floor string) string {
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

// claimSQL is the claim, of every topic or of those of $8 (topics), from a
// window of the oldest pending ordered messages or (fair) of each tenant's
// first (see claimWindowSQL).
//
// win: the window, the first $4 pending ordered messages by sequence.
// heads: those that are due and first among their group's unfinished
// messages (PENDING, PROCESSING, or a dead letter that blocks its group:
// blocks_group). The group index holds the waiting ones (PENDING and
// blocking dead letters) and the lease index the PROCESSING ones, each by
// group (see migration 11): a head is the first of its group in the one
// and before every message of its group in the other, and its run ends
// before its group's first leased message. runs: from each head, the
// consecutive due PENDING messages of its group (at most $5), with their
// position in the run. free: due unordered messages. cand: the oldest $3
// of both. locked: those still PENDING and due in their newest version
// (FOR UPDATE re-checks a row another claimer changed since this
// statement's snapshot) and not row-locked by another claimer. pairs:
// each locked row beside its candidate. valid: a run's message is kept
// only if every message before it in the run was locked too, so a message
// is never claimed while an earlier one of its group is held by someone
// else. The final row carries the window's size and last sequence so the
// caller knows whether to look past it. Paused topics and groups
// (outbox.Admin) are not claimed.
func claimSQL(topics, fair bool) string {
	tf := ""
	if topics {
		tf = " AND topic = ANY($8::text[])"
	}
	// The floors apply only on the server they were learned on (the
	// object's key "" names it by its start time): after a failover or
	// a restore, sequence numbers can be drawn again below them.
	return `WITH srv AS MATERIALIZED (
	SELECT ($7::jsonb ->> '') IS NOT DISTINCT FROM extract(epoch FROM pg_postmaster_start_time())::text AS same
), win AS MATERIALIZED (
	SELECT x.id, x.tenant, x.topic, x.grp, x.seq, x.next_attempt_at, x.tid,
		CASE WHEN x.floor <= x.seq AND (SELECT same FROM srv) THEN x.floor ELSE 0 END AS floor
	FROM (
		` + claimWindowSQL(topics, fair) + `
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
),` + claimTailSQL(tf, fair) + `
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
ORDER BY u.seq`
}

// claimWindowSQL is the claim's window (the ordered messages it looks at
// for heads): the oldest pending ones or, with fair, claimFairWindowSQL.
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
func claimWindowSQL(topics, fair bool) string {
	if fair {
		return claimFairWindowSQL(topics)
	}
	tf := ""
	if topics {
		tf = " AND topic = ANY($8::text[])"
	}
	floor := `coalesce(($7::jsonb ->> (tenant || chr(31) || topic || chr(31) || grp))::int8, 0)`
	return `SELECT id, tenant, topic, grp, seq, next_attempt_at, ctid AS tid, ` + floor + ` AS floor
		FROM {T}
		WHERE status = 'PENDING' AND grp <> '' AND seq >= $6` + tf + adminsql.NotPausedRowByRow("{P}", "") + `
		ORDER BY seq
		LIMIT $4`
}

// claimFairWindowSQL is the fair-share claim's window: for each tenant of
// the array $6 (see MessageClaim's fair share), the first waiting message
// of its first group (in the group index's order) that has one due; $4 is
// unused.
func claimFairWindowSQL(topics bool) string {
	ftf := ""
	if topics {
		ftf = " AND c.topic = ANY($8::text[])"
	}
	return `SELECT f.id, f.tenant, f.topic, f.grp, f.seq, f.next_attempt_at, f.tid,
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

// claimTailSQL is the claim's part from runs on, the same in every claim
// (runs, free, cand, locked, pairs, valid and upd: see claimSQL), with
// topicFilter on the unordered messages. cand's order is oldest runs first
// or, for the fair-share claim (fair), each run's first message, then each
// run's second, and so on: every tenant's run gets its head in however
// small a claim. The fair-share claim takes no unordered message.
func claimTailSQL(topicFilter string, fair bool) string {
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
	WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= $1` + topicFilter + adminsql.NotPausedRowByRow("{P}", "") + unordered + `
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

// claimFallbackSQL is the fallback claim, used when the window was full of blocked groups:
// a loose index scan visits every group with unfinished messages (one
// index descent each) and takes the heads past the window.
func claimFallbackSQL(topics bool) string {
	tf, tfh := "", ""
	if topics {
		tf = " AND topic = ANY($6::text[])"
		tfh = " AND g.topic = ANY($6::text[])"
	}
	return `WITH RECURSIVE groups AS (
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
),` + claimTailSQL(tf, false) + `
SELECT 0::bigint AS scanned, 0::bigint AS maxseq, 0::bigint AS minseq, extract(epoch FROM pg_postmaster_start_time())::text AS srv, {UCOLS}, u.tid
FROM (SELECT {ASYNC} AS sc) s
LEFT JOIN upd u ON true
ORDER BY u.seq`
}
