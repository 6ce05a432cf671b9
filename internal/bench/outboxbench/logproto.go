package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
)

// The log prototype (-only logproto) measures the storage design issue #28
// proposes before the store is rebuilt on it: messages are immutable rows
// of an append-only log, and a group's progress is an append-only series of
// marks (a lease: the run a claim took; done: how far the group is
// finished). Nothing on the hot path updates or deletes a row, so a held
// cleanup horizon leaves no dead row versions for the claim to walk; the
// latest mark of a group is one index descent however many marks came
// before it. Claims take advisory locks on the groups they consider (a
// try-lock: a claim never waits), so two claims never lease the same run,
// and read the groups' marks in a second statement, after the locks, so
// they see every mark committed before.
//
// It is a measurement, not a store: ordered messages only, no retries,
// dead letters, pauses or recovery of expired leases beyond taking them
// over, and the enqueue takes each group's lock as the store's does, so a
// group's sequence numbers commit in order. The same producers, backlog,
// groups, FIFO check and statistics as the continuous benchmark.

const lpDDL = `
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.log (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         text COLLATE "C" NOT NULL,
    tenant     text COLLATE "C" NOT NULL,
    topic      text COLLATE "C" NOT NULL,
    grp        text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    payload    json NOT NULL
);
CREATE UNIQUE INDEX log_id ON %[1]s.log (id);
CREATE INDEX log_grp ON %[1]s.log (tenant, topic, grp, seq);
CREATE TABLE %[1]s.marks (
    mseq   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant text COLLATE "C" NOT NULL,
    topic  text COLLATE "C" NOT NULL,
    grp    text COLLATE "C" NOT NULL,
    part   bigint NOT NULL DEFAULT 0, -- 0: a group; an unordered message (grp ''): its seq
    kind   text NOT NULL CHECK (kind IN ('done', 'lease', 'retry')),
    done   bigint NOT NULL,
    upto   bigint NOT NULL,
    token  bigint NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    not_before timestamptz,
    attempts   integer NOT NULL DEFAULT 0
);
CREATE INDEX marks_grp ON %[1]s.marks (tenant, topic, grp, part, mseq);
CREATE INDEX marks_due ON %[1]s.marks (not_before) WHERE kind = 'retry';
CREATE INDEX marks_lease ON %[1]s.marks (at) WHERE kind = 'lease';
CREATE TABLE %[1]s.groups (
    tenant text COLLATE "C" NOT NULL,
    topic  text COLLATE "C" NOT NULL,
    grp    text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, topic, grp)
);
`

// lpLatest is a group's latest mark, as a LATERAL subquery on g. A group
// is (tenant, topic, grp, part): part is 0 for a group of ordered
// messages, and an unordered message (grp ”) is a group of its own, part
// = its seq.
const lpLatest = `SELECT kind, done, upto, token, at, not_before, attempts FROM %[1]s.marks k
	WHERE k.tenant = g.tenant AND k.topic = g.topic AND k.grp = g.grp AND k.part = g.part ORDER BY mseq DESC LIMIT 1`

// lpClaimable is whether a group whose latest mark is m may be claimed: it
// has none, its last run is done, its retry is due, or its lease (of $7
// seconds) expired.
const lpClaimable = `(m.kind IS NULL OR m.kind = 'done' OR (m.kind = 'retry' AND m.not_before <= now())
	OR (m.kind = 'lease' AND m.at < now() - make_interval(secs => $7)))`

// lpCandidates finds the groups a claim may take, from append-only
// windows: the log from $1 ($2 rows: messages enqueued since the floor);
// the marks after $5 (groups whose run finished since this claimer last
// looked, with more messages behind it); and, by time since $6, the retry
// marks that came due and the leases ($7 seconds) that expired. It reads
// each group's latest mark, keeps those with messages past their done mark
// that may be claimed, and try-locks them in order of their first message
// until their runs fill the claim's $3 (at most $4 each). Its first row
// gives the floor the next log window may start from, which counts only
// idle groups (a leased or retrying group is found again through the mark
// that ends its wait, so it never holds the floor back), the last mark it
// read, and the statement's time.
const lpCandidates = `
WITH w0 AS MATERIALIZED (
	SELECT tenant, topic, grp, part, min(seq) AS first, max(seq) AS last, count(*) AS n
	FROM (SELECT seq, tenant, topic, grp, CASE WHEN grp = '' THEN seq ELSE 0 END AS part
		FROM %[1]s.log WHERE seq > $1 ORDER BY seq LIMIT $2) x
	GROUP BY tenant, topic, grp, part),
rm AS MATERIALIZED (
	SELECT tenant, topic, grp, part, max(mseq) AS mseq FROM %[1]s.marks WHERE mseq > $5 AND kind <> 'lease'
	GROUP BY tenant, topic, grp, part),
due AS MATERIALIZED (
	SELECT DISTINCT tenant, topic, grp, part FROM %[1]s.marks
	WHERE kind = 'retry' AND not_before > $6 AND not_before <= now()
	UNION
	SELECT DISTINCT tenant, topic, grp, part FROM %[1]s.marks
	WHERE kind = 'lease' AND at > $6 - make_interval(secs => $7) AND at <= now() - make_interval(secs => $7)),
w AS (
	SELECT tenant, topic, grp, part, first, last, n FROM w0
	UNION ALL
	SELECT tenant, topic, grp, part, 0, 0, $4 FROM (SELECT tenant, topic, grp, part FROM rm UNION SELECT tenant, topic, grp, part FROM due) o
	WHERE NOT EXISTS (SELECT 1 FROM w0 WHERE w0.tenant = o.tenant AND w0.topic = o.topic AND w0.grp = o.grp AND w0.part = o.part)),
s AS MATERIALIZED (
	SELECT g.tenant, g.topic, g.grp, g.part, g.n, g.first > 0 AS in_window, coalesce(m.done, 0) AS done,
		m.kind IS NULL OR m.kind = 'done' AS idle, ` + lpClaimable + ` AS claimable,
		CASE WHEN g.first > 0 THEN g.first ELSE nx.seq END AS first
	FROM w g LEFT JOIN LATERAL (` + lpLatest + `) m ON true
	LEFT JOIN LATERAL (SELECT seq FROM %[1]s.log l
		WHERE g.first = 0 AND l.tenant = g.tenant AND l.topic = g.topic AND l.grp = g.grp AND l.seq > coalesce(m.done, 0)
			AND (g.part = 0 OR l.seq = g.part)
		ORDER BY seq LIMIT 1) nx ON true
	WHERE CASE WHEN g.first > 0 THEN coalesce(m.done, 0) < g.last ELSE nx.seq IS NOT NULL END),
c AS MATERIALIZED (
	SELECT s.*, sum(least(n, $4)) OVER (ORDER BY first) - least(n, $4) AS before FROM s WHERE claimable)
SELECT NULL::text, NULL::text, NULL::text, NULL::bigint,
	(SELECT coalesce(min(greatest(done, first - 1)) FILTER (WHERE in_window AND idle), (SELECT max(last) FROM w0)) FROM s),
	(SELECT max(mseq) FROM rm), now()
UNION ALL
(SELECT tenant, topic, grp, part, NULL, NULL, NULL FROM c
	WHERE before < $3 AND pg_try_advisory_xact_lock(2, hashtext(tenant || '/' || topic || '/' || grp || '/' || part))
	ORDER BY first)`

// lpBackstop finds the true floor: the first unfinished message of every
// group the registry knows, one probe of the group index per group. It is
// what a claim's window may have passed: a transaction that drew its seq
// before the floor moved past it and committed after. Its cost follows the
// number of groups, not the log's length.
const lpBackstop = `
SELECT min(l.seq) - 1 FROM (SELECT tenant, topic, grp, 0::bigint AS part FROM %[1]s.groups) g
LEFT JOIN LATERAL (` + lpLatest + `) m ON true
CROSS JOIN LATERAL (SELECT seq FROM %[1]s.log l
	WHERE l.tenant = g.tenant AND l.topic = g.topic AND l.grp = g.grp AND l.seq > coalesce(m.done, 0) ORDER BY seq LIMIT 1) l`

// lpTake leases the locked groups' next runs (at most $4 each) to token
// $5, after reading their marks again: the locks were taken by the
// statement before, so this statement's snapshot holds every mark
// committed under them.
var lpTake = `
WITH g AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $7::bigint[]) AS g(tenant, topic, grp, part)),
s AS MATERIALIZED (
	SELECT g.*, coalesce(m.done, 0) AS done, CASE WHEN m.kind = 'done' THEN 0 ELSE coalesce(m.attempts, 0) END AS attempts
	FROM g LEFT JOIN LATERAL (` + lpLatest + `) m ON true
	WHERE ` + strings.ReplaceAll(lpClaimable, "$7", "$6") + `),
r AS MATERIALIZED (
	SELECT s.tenant, s.topic, s.grp, s.part, s.done, s.attempts, l.seq, l.id, l.payload FROM s CROSS JOIN LATERAL (
		SELECT seq, id, payload FROM %[1]s.log l
		WHERE l.tenant = s.tenant AND l.topic = s.topic AND l.grp = s.grp AND l.seq > s.done AND (s.part = 0 OR l.seq = s.part)
		ORDER BY seq LIMIT $4) l),
ins AS (INSERT INTO %[1]s.marks (tenant, topic, grp, part, kind, done, upto, token, attempts)
	SELECT tenant, topic, grp, part, 'lease', done, max(seq), $5, attempts + 1 FROM r GROUP BY tenant, topic, grp, part, done, attempts)
SELECT tenant, topic, grp, seq, id, payload::text FROM r ORDER BY seq`

// lpDone marks the runs finished, fenced by their lease's token; run after
// the groups' locks are held (blocking, in key order: finishes never
// deadlock, claims only try).
const lpDone = `
INSERT INTO %[1]s.marks (tenant, topic, grp, part, kind, done, upto, token, not_before, attempts)
SELECT g.tenant, g.topic, g.grp, g.part, CASE WHEN g.retry_at IS NULL THEN 'done' ELSE 'retry' END, g.upto, g.upto, 0, g.retry_at, m.attempts
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $6::timestamptz[], $7::bigint[]) AS g(tenant, topic, grp, upto, retry_at, part)
CROSS JOIN LATERAL (` + lpLatest + `) m WHERE m.kind = 'lease' AND m.token = $5
RETURNING grp`

// lpNoJIT turns PostgreSQL's JIT compiler off for the transaction. The
// candidates statement's estimated cost grows with the tables (its
// lateral lookups are costed per group from the tables' statistics), and
// once it passes jit_above_cost (100,000 by default) the server compiles
// it on every execution: 841 ms of JIT for 19 ms of work, measured 2
// minutes into a held run. JIT pays for long analytic queries; a claim
// never is one.
const lpNoJIT = `SET LOCAL jit = off`

type lpStore struct {
	jit    bool // leave JIT to the server's setting (to measure what it costs)
	pool   *pgxpool.Pool
	schema string
	q      map[string]string
}

func newLogProto(ctx context.Context, pool *pgxpool.Pool) (*lpStore, func(), error) {
	var b [5]byte
	_, _ = rand.Read(b[:])
	s := &lpStore{pool: pool, schema: "bench_lp_" + hex.EncodeToString(b[:])}
	if _, err := pool.Exec(ctx, fmt.Sprintf(lpDDL, s.schema)); err != nil {
		return nil, nil, err
	}
	s.q = map[string]string{}
	for k, v := range map[string]string{"cand": lpCandidates, "take": lpTake, "done": lpDone, "backstop": lpBackstop, "enqueue": lpEnqueue} {
		s.q[k] = fmt.Sprintf(v, s.schema)
	}
	return s, func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+s.schema+" CASCADE") }, nil
}

// lpEnqueue inserts a batch in one statement: the groups' enqueue locks
// (key space 1, held to the commit, in key order), the log rows, and the
// groups the registry does not know yet (a probe, no write, for the others).
// Unordered messages (group "") take neither: nothing orders them.
// The scalar subqueries make the locks come first.
const lpEnqueue = `
WITH u AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, t, p, g, pl)),
l AS (SELECT count(pg_advisory_xact_lock(1, h)) AS n FROM (SELECT DISTINCT hashtext(t || '/' || p || '/' || g) AS h FROM u WHERE g <> '' ORDER BY 1) x),
reg AS (INSERT INTO %[1]s.groups SELECT DISTINCT t, p, g FROM u WHERE g <> '' AND (SELECT n FROM l) >= 0 ON CONFLICT DO NOTHING)
INSERT INTO %[1]s.log (id, tenant, topic, grp, payload) SELECT id, t, p, g, pl::json FROM u WHERE (SELECT n FROM l) >= 0`

// enqueue inserts msgs in one transaction of its own.
func (s *lpStore) enqueue(ctx context.Context, msgs []outbox.Message) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.enqueueTx(ctx, tx, msgs) })
}

// enqueueTx inserts msgs in the caller's transaction.
func (s *lpStore) enqueueTx(ctx context.Context, tx pgx.Tx, msgs []outbox.Message) error {
	n := len(msgs)
	ids, tenants, topics, grps, pls := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, m := range msgs {
		var b [16]byte
		_, _ = rand.Read(b[:])
		ids[i], tenants[i], topics[i], grps[i], pls[i] = hex.EncodeToString(b[:]), "", m.Topic, m.Group, string(m.Payload)
	}
	_, err := tx.Exec(ctx, s.q["enqueue"], ids, tenants, topics, grps, pls)
	return err
}

type lpRun struct {
	tenant, topic, grp string
	part               int64      // an unordered message's seq, 0 for a group
	upto               int64      // the last message sent: the group's done mark
	retryAt            *time.Time // set: the message after upto failed and waits until then
}

type lpClaimer struct {
	s               *lpStore
	floor           int64
	nextRescan      time.Time
	window, perGrp  int
	limit, margin   int
	rescans, claims int
	markSeen        int64     // the last mark the candidates read (less the margin next time: late commits)
	dueFrom         time.Time // the time windows (retries due, leases expired) start here
	lease           time.Duration
	explainEvery    time.Duration // set: print EXPLAIN (ANALYZE, BUFFERS) of the claim's statements this often
	nextExplain     time.Time
}

// explain prints the plans of the claim's two statements, as the next
// claim would run them, executed in a transaction that is rolled back
// (the take's lease marks and the locks go with it).
func (c *lpClaimer) explain(ctx context.Context, from int64, lease float64) error {
	tx, err := c.s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if !c.s.jit {
		if _, err := tx.Exec(ctx, lpNoJIT); err != nil {
			return err
		}
	}
	args := c.candArgs(from, lease)
	out := fmt.Sprintf("--- explain at claim %d (floor %d, markSeen %d, dueFrom %s)\n", c.claims, c.floor, c.markSeen, c.dueFrom.Format(time.RFC3339Nano))
	cands, err := readCands(ctx, tx, c.s.q["cand"], args)
	if err != nil {
		return err
	}
	for _, q := range []struct {
		name string
		sql  string
		args []any
	}{{"cand", c.s.q["cand"], args}, {"take", c.s.q["take"], cands.takeArgs(c.perGrp, 1, lease)}} {
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.sql, q.args...)
		if err != nil {
			return err
		}
		out += "-- " + q.name + "\n"
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				return err
			}
			out += line + "\n"
		}
		if err := rows.Err(); err != nil {
			return err
		}
	}
	fmt.Fprint(os.Stderr, out)
	return nil
}

// candArgs are the arguments of the claim's candidates statement (cand),
// the windows starting where the previous claim left them.
func (c *lpClaimer) candArgs(from int64, lease float64) []any {
	return []any{from, c.window, c.limit, c.perGrp, max(c.markSeen-int64(c.margin), 0), c.dueFrom, lease}
}

// lpCands is what the candidates statement returned: the groups (and
// unordered messages, part > 0) to take, and where its windows stand.
type lpCands struct {
	ts, ps, gs []string
	parts      []int64
	floor      int64      // the log's floor, -1 when no row carried one
	markSeen   int64      // the newest mark read (0 when none)
	dueAt      *time.Time // the last time a row's due window reached, nil when none
}

// readCands runs the candidates statement q with args in tx and reads its
// rows.
func readCands(ctx context.Context, tx pgx.Tx, q string, args []any) (lpCands, error) {
	out := lpCands{floor: -1}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var t, p, g *string
		var part, f, mk *int64
		var at *time.Time
		if err := rows.Scan(&t, &p, &g, &part, &f, &mk, &at); err != nil {
			return out, err
		}
		if at != nil {
			out.dueAt = at
		}
		if f != nil {
			out.floor = *f
		}
		if mk != nil {
			out.markSeen = max(out.markSeen, *mk)
		}
		if g != nil {
			out.ts, out.ps, out.gs, out.parts = append(out.ts, *t), append(out.ps, *p), append(out.gs, *g), append(out.parts, *part)
		}
	}
	return out, rows.Err()
}

// takeArgs are the arguments of the take statement for these candidates.
func (cs lpCands) takeArgs(perGrp int, token int64, lease float64) []any {
	return []any{cs.ts, cs.ps, cs.gs, perGrp, token, lease, cs.parts}
}

// claim leases up to limit messages; it returns them with the runs to
// finish and the lease's token.
func (c *lpClaimer) claim(ctx context.Context) ([]outbox.Message, []lpRun, int64, error) {
	var tb [8]byte
	_, _ = rand.Read(tb[:])
	token := int64(binary.LittleEndian.Uint64(tb[:])>>1) + 1
	rescan := time.Now().After(c.nextRescan)
	started := time.Now()
	if rescan {
		var floor *int64
		if err := pgx.BeginFunc(ctx, c.s.pool, func(tx pgx.Tx) error {
			if !c.s.jit {
				if _, err := tx.Exec(ctx, lpNoJIT); err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, c.s.q["backstop"]).Scan(&floor)
		}); err != nil {
			return nil, nil, 0, err
		}
		if floor != nil {
			c.floor = *floor + int64(c.margin)
		}
	}
	from := max(c.floor-int64(c.margin), 0)
	if c.explainEvery > 0 && time.Now().After(c.nextExplain) {
		c.nextExplain = time.Now().Add(c.explainEvery)
		if err := c.explain(ctx, from, cmp.Or(c.lease, 30*time.Second).Seconds()); err != nil {
			return nil, nil, 0, fmt.Errorf("explain: %w", err)
		}
	}
	var msgs []outbox.Message
	var runs []lpRun
	err := pgx.BeginFunc(ctx, c.s.pool, func(tx pgx.Tx) error {
		if !c.s.jit {
			if _, err := tx.Exec(ctx, lpNoJIT); err != nil {
				return err
			}
		}
		lease := cmp.Or(c.lease, 30*time.Second).Seconds()
		cands, err := readCands(ctx, tx, c.s.q["cand"], c.candArgs(from, lease))
		if err != nil {
			return err
		}
		if cands.dueAt != nil {
			// The time windows cover the time since the last claim, less a
			// second: a mark that came due before this statement but
			// committed after it is read by the next one. (Reading them
			// once a second instead, with a time far ahead in between, made
			// PostgreSQL's cached generic plan for the statement ten times
			// slower.)
			c.dueFrom = cands.dueAt.Add(-time.Second)
		}
		c.markSeen = max(c.markSeen, cands.markSeen)
		if cands.floor > c.floor {
			c.floor = cands.floor
		}
		if len(cands.gs) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, c.s.q["take"], cands.takeArgs(c.perGrp, token, lease)...)
		if err != nil {
			return err
		}
		var cur *lpRun
		for rows.Next() {
			var m outbox.Message
			var pl string
			if err := rows.Scan(&m.Tenant, &m.Topic, &m.Group, &m.Seq, &m.ID, &pl); err != nil {
				return err
			}
			m.Payload = []byte(pl)
			msgs = append(msgs, m)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		idx := map[lpRun]int{}
		for _, m := range msgs {
			k := lpRun{tenant: m.Tenant, topic: m.Topic, grp: m.Group}
			if m.Group == "" {
				k.part = m.Seq
			}
			i, ok := idx[k]
			if !ok {
				i = len(runs)
				idx[k] = i
				runs = append(runs, k)
			}
			cur = &runs[i]
			cur.upto = max(cur.upto, m.Seq)
		}
		return nil
	})
	if rescan {
		d := time.Since(started)
		c.rescans++
		c.nextRescan = time.Now().Add(min(max(20*d, time.Second), 30*time.Second))
	}
	c.claims++
	return msgs, runs, token, err
}

func (s *lpStore) finish(ctx context.Context, runs []lpRun, token int64) (applied int, err error) {
	n := len(runs)
	ts, ps, gs, up, at, parts := make([]string, n), make([]string, n), make([]string, n), make([]int64, n), make([]*time.Time, n), make([]int64, n)
	for i, r := range runs {
		ts[i], ps[i], gs[i], up[i], at[i], parts[i] = r.tenant, r.topic, r.grp, r.upto, r.retryAt, r.part
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if !s.jit {
			if _, err := tx.Exec(ctx, lpNoJIT); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(2, h) FROM (SELECT DISTINCT hashtext(t || '/' || p || '/' || g || '/' || part) AS h
			FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS u(t, p, g, part) ORDER BY 1) x`, ts, ps, gs, parts); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, s.q["done"], ts, ps, gs, up, token, at, parts)
		applied = int(tag.RowsAffected())
		return err
	})
	return applied, err
}

// benchLogProto is benchContinuous on the log prototype: 4 producers keep
// the backlog near backlog, procs workers claim (500, at most 100 per
// group), check FIFO and mark their runs done.
func benchLogProto(ctx context.Context, c config, pool *pgxpool.Pool, procs, backlog int) (float64, string, error) {
	s, cleanup, err := newLogProto(ctx, pool)
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	if err := lpFill(ctx, s, backlog, c.lpGroups); err != nil {
		return 0, "", err
	}
	var enqueued atomic.Int64
	enqueued.Store(int64(backlog))
	ws, release, err := lpWorkerStore(ctx, c, s, procs)
	if err != nil {
		return 0, "", err
	}
	defer release()
	pub := newFIFO()
	stopWorkers := lpWorkers(ctx, ws, pub, procs, c)
	stopProducers := produce(ctx, backlog, &pub.n, &enqueued, func(w int, rng *mrand.Rand) string {
		return lpGroup(w + 4*rng.IntN(c.lpGroups/4))
	}, s.enqueue)
	win, err := measureWindow(ctx, c, pool, s.schema, &pub.n, &enqueued)
	if err != nil {
		return 0, "", err
	}
	perr := stopProducers()
	claims, rescans, werr := stopWorkers()
	if err := errors.Join(perr, werr); err != nil {
		return 0, "", err
	}
	note := fmt.Sprintf("log prototype: enqueued %.0f msg/s, backlog %d-%d", win.enqueueRate(), win.lo, win.hi) + pub.fifoNote()
	note += fmt.Sprintf(", claims %d (%d rescans)", claims, rescans)
	return win.rate(), note + win.note(true), nil
}

// lpWorkers runs procs workers on ws until stop: each claims (c.claimBatch,
// at most 100 per group), publishes to pub and marks its runs done,
// polling every 100 ms when a claim finds nothing.
func lpWorkers(ctx context.Context, ws *lpStore, pub *fifoPublisher, procs int, c config) (stop func() (claims, rescans int64, err error)) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	var nClaims, nRescans atomic.Int64
	for w := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &lpClaimer{s: ws, window: 1000 + 4*c.claimBatch, perGrp: 100, limit: c.claimBatch, margin: 1000}
			if w == 0 {
				cl.explainEvery = c.lpExplain
			}
			defer func() { nClaims.Add(int64(cl.claims)); nRescans.Add(int64(cl.rescans)) }()
			for ctx.Err() == nil {
				msgs, runs, token, err := cl.claim(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("claim: %w", err)
					}
					return
				}
				if len(msgs) == 0 {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				pub.Publish(ctx, msgs)
				if _, err := ws.finish(ctx, runs, token); err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("finish: %w", err)
					}
					return
				}
			}
		}()
	}
	return func() (int64, int64, error) {
		cancel()
		wg.Wait()
		close(errs)
		return nClaims.Load(), nRescans.Load(), <-errs
	}
}

// lpFill enqueues n messages over groups groups (message i in group
// i%groups) in transactions of 1,000.
func lpFill(ctx context.Context, s *lpStore, n, groups int) error {
	for i := 0; i < n; i += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			g := lpGroup(j % groups)
			msgs = append(msgs, outbox.Message{Topic: "bench", Group: g, Payload: payload(g, j/groups)})
		}
		if err := s.enqueue(ctx, msgs); err != nil {
			return err
		}
	}
	_, err := s.pool.Exec(ctx, "VACUUM ANALYZE "+s.schema+".log")
	return err
}

// benchLogProtoDrain is the drain on the log prototype: c.drainN messages
// over c.drainGroups groups, enqueued first, then worked by procs workers;
// the figure is messages per second from the workers' start to the last
// publication, the note the statistics of that span.
func benchLogProtoDrain(ctx context.Context, c config, pool *pgxpool.Pool, procs int) (float64, string, error) {
	s, cleanup, err := newLogProto(ctx, pool)
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	if err := lpFill(ctx, s, c.drainN, c.drainGroups); err != nil {
		return 0, "", err
	}
	ws, release, err := lpWorkerStore(ctx, c, s, procs)
	if err != nil {
		return 0, "", err
	}
	defer release()
	settle()
	w0, err := schemaWork(ctx, pool, s.schema)
	if err != nil {
		return 0, "", err
	}
	cpu0, local := pgCPU(c.dsn)
	pub := newFIFO()
	start := time.Now()
	stop := lpWorkers(ctx, ws, pub, procs, c)
	for pub.n.Load() < int64(c.drainN) {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu1, _ := pgCPU(c.dsn)
	claims, rescans, err := stop()
	if err != nil {
		return 0, "", err
	}
	w1, err := settledWork(ctx, pool, s.schema, 0)
	if err != nil {
		return 0, "", err
	}
	n := c.drainN
	note := fmt.Sprintf("log prototype: FIFO held: %s, duplicates: %d, claims %d (%d rescans), dead row versions %.2f/msg, %s",
		map[bool]string{true: "yes", false: "NO"}[pub.violated.Load() == 0], pub.dup.Load(), claims, rescans,
		float64(w1.updates+w1.deletes-w0.updates-w0.deletes)/float64(n), w1.perMessage(w0, n))
	if local {
		note += fmt.Sprintf(", PostgreSQL CPU %.0f µs/msg", float64((cpu1-cpu0).Microseconds())/float64(n))
	}
	return float64(n) / elapsed.Seconds(), note, nil
}

// lpGroup names group n: the benchmark's names for the first 1,000, then
// more of the same form (-lp-groups).
func lpGroup(n int) string {
	if n < len(groupNames) {
		return groupNames[n]
	}
	return fmt.Sprintf("group-%04d", n)
}

// benchLogProtoEnqueue is benchEnqueue on the log prototype: c.clients
// transactions at a time, each enqueueing per messages over spread random
// groups, for c.enqueueFor. The prototype sends no notification (the store
// does, coalesced).
func benchLogProtoEnqueue(ctx context.Context, c config, pool *pgxpool.Pool, per, spread int) (float64, string, error) {
	s, cleanup, err := newLogProto(ctx, pool)
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	rate, _, err := enqueueClients(c, per, spread, func(msgs []outbox.Message) error { return s.enqueue(ctx, msgs) })
	return rate, "log prototype", err
}

// lpWorkerStore returns s on a pool of the workers' own (their backends'
// CPU is told apart), with the cleanup horizon held from a session of its
// own when c.hold; release undoes both.
func lpWorkerStore(ctx context.Context, c config, s *lpStore, procs int) (ws *lpStore, release func(), err error) {
	unhold := func() {}
	if c.hold {
		if unhold, err = holdHorizon(ctx, c.dsn); err != nil {
			return nil, nil, err
		}
	}
	wpool, err := newPoolNamed(ctx, c.dsn, int32(procs+4), procApp)
	if err != nil {
		unhold()
		return nil, nil, err
	}
	return &lpStore{pool: wpool, schema: s.schema, q: s.q, jit: c.lpJIT}, func() { wpool.Close(); unhold() }, nil
}
