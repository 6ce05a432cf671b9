package postgres

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// logGroupKey names a group in the append-only path: part is 0 for a
// group, an unordered message's seq for that message.
type logGroupKey struct {
	tenant, topic, grp string
	part               int64
}

// logLockGroups is the outcomes' rows by message ID, after the locks of
// their groups (blocking, in key order: outcomes never deadlock, claims
// only try).
const logLockGroups = `WITH o AS MATERIALIZED (
	SELECT m.id, m.tenant, m.topic, m.grp, CASE WHEN m.grp = '' THEN m.seq ELSE 0 END AS part FROM {T} m
	WHERE m.id = ANY($1::text[])
), lk AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock($2::int4, h)) AS n FROM (
		SELECT DISTINCT hashtext(tenant || chr(31) || topic || chr(31) || grp || chr(31) || part) AS h FROM o ORDER BY 1) x
)
SELECT o.tenant, o.topic, o.grp, o.part FROM o, lk WHERE lk.n >= 0`

// logLockKnown locks the groups $1-$4 (blocking, in key order, as
// logLockGroups) and returns them: the outcomes' groups, when the store
// claimed their messages itself and so knows them (logKnown).
const logLockKnown = `WITH g AS MATERIALIZED (
	SELECT DISTINCT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) AS g(tenant, topic, grp, part)
), lk AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock($5::int4, h)) AS n FROM (
		SELECT DISTINCT hashtext(tenant || chr(31) || topic || chr(31) || grp || chr(31) || part) AS h FROM g ORDER BY 1) x
)
SELECT g.tenant, g.topic, g.grp, g.part FROM g, lk WHERE lk.n >= 0`

// logKnownCap bounds logKnown: past it, the store forgets what it knew
// (a message whose outcome never came, its processor gone) and its
// outcomes' groups are read from their rows again.
const logKnownCap = 1 << 20

// logKnown is the group of each message this store claimed and has not
// finished: a message's group never changes, so an outcome's group needs
// no read of its row. An outcome of a message the store does not know
// (claimed by another store, or before a restart) reads it.
type logKnown struct {
	mu sync.Mutex
	m  map[string]logGroupKey
}

// add records the groups of claimed messages.
func (k *logKnown) add(msgs []outbox.Message) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil || len(k.m)+len(msgs) > logKnownCap {
		k.m = make(map[string]logGroupKey, len(msgs))
	}
	for _, m := range msgs {
		k.m[m.ID] = logKeyOf(m)
	}
}

// groups returns the groups of ids as arrays, and false when one is not
// known.
func (k *logKnown) groups(ids []string) (ts, ps, gs []string, parts []int64, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		g, found := k.m[id]
		if !found {
			return nil, nil, nil, nil, false
		}
		ts, ps, gs, parts = append(ts, g.tenant), append(ps, g.topic), append(gs, g.grp), append(parts, g.part)
	}
	return ts, ps, gs, parts, true
}

// forget drops ids, once their outcomes are written.
func (k *logKnown) forget(ids []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		delete(k.m, id)
	}
}

// logKeyOf is the group of a claimed message in the append-only path.
func logKeyOf(m outbox.Message) logGroupKey {
	g := logGroupKey{tenant: m.Tenant, topic: m.Topic, grp: m.Group}
	if m.Group == "" {
		g.part = m.Seq
	}
	return g
}

// logRuns is the latest mark of each group ($1-$4) and, when it is a
// lease, the run's waiting messages (PENDING, or dead letters that block
// the group) in order; read after the groups' locks.
const logRuns = `WITH g AS (
	SELECT DISTINCT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) AS g(tenant, topic, grp, part)
)
SELECT g.tenant, g.topic, g.grp, g.part, k.kind, k.done, k.upto, k.token::text, k.owner, k.at,
	r.id, r.seq, r.status, r.attempts, r.recoveries
FROM g LEFT JOIN LATERAL (` + logLatest + `) k ON true
LEFT JOIN LATERAL (
	SELECT b.id, b.seq, b.status, b.attempts, b.recoveries FROM {T} b
	WHERE k.kind = 'lease' AND g.part = 0 AND b.tenant = g.tenant AND b.topic = g.topic AND b.grp = g.grp
		AND (b.status = 'PENDING' OR b.blocks_group) AND b.grp <> '' AND b.seq > k.done AND b.seq <= k.upto
	UNION ALL
	SELECT b.id, b.seq, b.status, b.attempts, b.recoveries FROM {T} b
	WHERE k.kind = 'lease' AND g.part > 0 AND b.seq = g.part AND b.status = 'PENDING' AND b.claimed_by IS NULL AND b.seq > k.done
) r ON true
ORDER BY g.tenant, g.topic, g.grp, g.part, r.seq`

// logWrite applies the outcomes that change a row ($2-$12: a retry, a dead
// letter, a deferred release, a sent message with a provider ID or
// response or sent out of its run's order), their attempts history
// ($13-$21), the groups' new marks ($22-$31) and the sent messages deleted
// ($32), at $1.
const logWrite = `WITH x AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::timestamptz[], $6::text[], $7::text[], $8::text[],
		$9::text[], $10::bool[], $11::timestamptz[], $12::bool[])
		AS x(id, kind, attempt, next, code, msg, pmid, resp, block, started, haserr)
), up AS (
	UPDATE {T} m SET
		status = CASE x.kind WHEN 'sent' THEN 'SENT' WHEN 'dead' THEN 'FAILED' ELSE m.status END,
		attempts = CASE WHEN x.kind = 'released' THEN m.attempts ELSE x.attempt END,
		next_attempt_at = CASE WHEN x.kind IN ('retry', 'released') AND x.next IS NOT NULL THEN x.next ELSE m.next_attempt_at END,
		last_error_code = CASE WHEN x.haserr THEN x.code ELSE m.last_error_code END,
		last_error_message = CASE WHEN x.haserr THEN x.msg ELSE m.last_error_message END,
		provider_message_id = CASE x.kind WHEN 'sent' THEN x.pmid ELSE m.provider_message_id END,
		sent_at = CASE x.kind WHEN 'sent' THEN coalesce(m.sent_at, $1) ELSE m.sent_at END,
		sent_response = CASE WHEN x.kind = 'sent' AND x.attempt = 1 AND m.recoveries = 0 THEN x.resp::json ELSE m.sent_response END,
		sent_started_at = CASE WHEN x.kind = 'sent' AND x.attempt = 1 AND m.recoveries = 0 THEN x.started ELSE m.sent_started_at END,
		sent_finished_at = CASE WHEN x.kind = 'sent' AND x.attempt = 1 AND m.recoveries = 0 THEN $1 ELSE m.sent_finished_at END,
		blocks_group = CASE x.kind WHEN 'dead' THEN x.block AND m.grp <> '' ELSE m.blocks_group END,
		updated_at = $1
	FROM x WHERE m.id = x.id
	RETURNING m.id
), del AS (
	-- Options.DeleteSentTopics: those sent messages are deleted, with
	-- their history.
	DELETE FROM {T} m WHERE m.id = ANY($32::text[]) RETURNING m.id
), del_att AS (
	DELETE FROM {A} a USING del WHERE a.message_id = del.id
), woke AS (
	-- A message given back is claimable again: wake the listeners ($33,
	-- "" for none), as the enqueue does.
	SELECT count(pg_notify($33, '')) AS n WHERE $33 <> ''
), att AS (
	INSERT INTO {A} (message_id, tenant, number, outcome, error_code, error_message,
		provider_response, next_attempt_at, started_at, finished_at)
	SELECT a.id, a.tenant, a.number, a.outcome, a.code, a.msg, a.resp::json, a.next, a.started, $1
	FROM unnest($13::text[], $14::text[], $15::int4[], $16::text[], $17::text[], $18::text[], $19::text[],
		$20::timestamptz[], $21::timestamptz[]) AS a(id, tenant, number, outcome, code, msg, resp, next, started)
)
INSERT INTO {K} (tenant, topic, grp, part, kind, done, upto, token, owner, at)
SELECT k.tenant, k.topic, k.grp, k.part, k.kind, k.done, k.upto, k.token::uuid, k.owner, k.at
FROM unnest($22::text[], $23::text[], $24::text[], $25::int8[], $26::text[], $27::int8[], $28::int8[],
	$29::text[], $30::text[], $31::timestamptz[]) AS k(tenant, topic, grp, part, kind, done, upto, token, owner, at)
WHERE (SELECT count(*) FROM up) >= 0 AND (SELECT count(*) FROM del) >= 0 AND (SELECT n FROM woke) >= 0`

// logRun is a group's latest mark and, when it is a lease, its run's
// waiting messages.
type logRun struct {
	kind, token, owner string
	done, upto         int64
	at                 time.Time
	rows               []logRunRow
}

type logRunRow struct {
	id                   string
	seq                  int64
	status               string
	attempts, recoveries int
}

// logWrites collects what an outcome batch writes.
type logWrites struct {
	// rows changed
	id, kind, code, msg, pmid, resp []*string
	attempt                         []int32
	next, started                   []*time.Time
	block, haserr                   []bool
	// attempts history
	aID, aTenant, aOutcome, aCode, aMsg, aResp []*string
	aNumber                                    []int32
	aNext, aStarted                            []*time.Time
	// marks
	kTenant, kTopic, kGrp, kKind []string
	kToken, kOwner               []*string
	kPart, kDone, kUpto          []int64
	kAt                          []time.Time
	// sent messages deleted (Options.DeleteSentTopics)
	del []string
	// wake: a message was given back (released or retried)
	wake bool
}

// row records an outcome that changes its row.
func (w *logWrites) row(o outbox.Outcome, now time.Time) {
	var code, msg *string
	if o.Error != nil {
		code, msg = nullText(o.Error.Code), nullText(o.Error.Message)
		if code == nil {
			code = new(string)
		}
		if msg == nil {
			msg = new(string)
		}
	}
	w.id = append(w.id, nullText(o.ID))
	w.kind = append(w.kind, nullText(string(o.Kind)))
	w.attempt = append(w.attempt, int32(o.Attempt)) //nolint:gosec // attempts are small
	w.next = append(w.next, nullTime(o.NextAttemptAt))
	w.code, w.msg = append(w.code, code), append(w.msg, msg)
	w.pmid = append(w.pmid, nullText(o.ProviderMessageID))
	w.resp = append(w.resp, jsonText(o.ProviderResponse))
	w.block = append(w.block, o.BlockGroup)
	started := o.StartedAt
	if started.IsZero() {
		started = now
	}
	w.started = append(w.started, &started)
	w.haserr = append(w.haserr, o.Error != nil)
}

// history records an attempts row for an outcome.
func (w *logWrites) history(o outbox.Outcome, tenant, outcome string, now time.Time) {
	var code, msg *string
	if o.Error != nil {
		code, msg = nullText(o.Error.Code), nullText(o.Error.Message)
	}
	started := o.StartedAt
	if started.IsZero() {
		started = now
	}
	w.aID, w.aTenant, w.aOutcome = append(w.aID, nullText(o.ID)), append(w.aTenant, &tenant), append(w.aOutcome, &outcome)
	w.aCode, w.aMsg, w.aResp = append(w.aCode, code), append(w.aMsg, msg), append(w.aResp, jsonText(o.ProviderResponse))
	w.aNumber = append(w.aNumber, int32(o.Attempt)) //nolint:gosec // attempts are small
	var next *time.Time
	if o.Kind == outbox.OutcomeRetry {
		next = nullTime(o.NextAttemptAt)
	}
	w.aNext, w.aStarted = append(w.aNext, next), append(w.aStarted, &started)
}

// mark records a group's new mark.
func (w *logWrites) mark(g logGroupKey, kind string, done, upto int64, token, owner string, at time.Time) {
	w.kTenant, w.kTopic, w.kGrp, w.kPart = append(w.kTenant, g.tenant), append(w.kTopic, g.topic), append(w.kGrp, g.grp), append(w.kPart, g.part)
	w.kKind, w.kDone, w.kUpto, w.kAt = append(w.kKind, kind), append(w.kDone, done), append(w.kUpto, upto), append(w.kAt, at)
	w.kToken, w.kOwner = append(w.kToken, nullText(token)), append(w.kOwner, nullText(owner))
}

func (w *logWrites) args(now time.Time, channel string) []any {
	if !w.wake {
		channel = ""
	}
	return []any{now, w.id, w.kind, w.attempt, w.next, w.code, w.msg, w.pmid, w.resp, w.block, w.started, w.haserr,
		w.aID, w.aTenant, w.aNumber, w.aOutcome, w.aCode, w.aMsg, w.aResp, w.aNext, w.aStarted,
		w.kTenant, w.kTopic, w.kGrp, w.kPart, w.kKind, w.kDone, w.kUpto, w.kToken, w.kOwner, w.kAt, w.del, channel}
}

// logFinish is MessageFinish on the append-only path. Each outcome is
// fenced by its group's latest mark: the lease of this owner under the
// outcome's claim token, covering the message, at the outcome's attempt.
// A run's messages finished in order (sent, or dead letters that do not
// hold the group) move the group's done forward with no write to their
// rows; the run's lease ends at its first message given back (retried,
// released, or a dead letter that holds the group), or once every message
// of the run has an outcome; until then a lease mark records the progress.
func (s *Store) logFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	now := s.at(p.Now)
	owner := text(p.Owner)
	byID := make(map[string]outbox.Outcome, len(p.Outcomes))
	ids := make([]string, 0, len(p.Outcomes))
	for _, o := range p.Outcomes {
		byID[o.ID] = o
		ids = append(ids, o.ID)
	}
	applied := make(map[string]bool, len(ids))
	// write fences the outcomes against the groups' runs and returns the
	// write's arguments, nil when nothing is to be written.
	write := func(runs map[logGroupKey]*logRun, order []logGroupKey) []any {
		clear(applied)
		var w logWrites
		for _, g := range order {
			logFinishRun(&w, g, runs[g], byID, owner, now, applied, s.deleteSent)
		}
		if len(w.kTenant) == 0 && len(w.id) == 0 {
			return nil
		}
		return w.args(now, s.notifyChannel())
	}
	var err error
	if a, ok := s.db.(acquirer); ok {
		err = s.logFinishPiped(ctx, a, ids, write)
	} else {
		err = s.logTx(ctx, func(tx pgx.Tx) error {
			clear(applied)
			var ts, ps, gs []string
			var parts []int64
			var err error
			if kt, kp, kg, kparts, ok := s.logKnown.groups(ids); ok {
				ts, ps, gs, parts, err = logGroups(ctx, tx, s.lsql.logLockKnown, kt, kp, kg, kparts, s.groupNS+logClaimLockKey)
			} else {
				ts, ps, gs, parts, err = logGroups(ctx, tx, s.lsql.logLockGroups, ids, s.groupNS+logClaimLockKey)
			}
			if err != nil || len(gs) == 0 {
				return err
			}
			runs, order, err := s.logRuns(ctx, tx, ts, ps, gs, parts)
			if err != nil {
				return err
			}
			if args := write(runs, order); args != nil {
				_, err = tx.Exec(ctx, s.lsql.logWrite, args...)
			}
			return err
		})
	}
	if err != nil {
		return outbox.FinishResult{}, wrapErr("finish", err)
	}
	s.logKnown.forget(ids)
	return outbox.FinishResult{LeaseLost: lost(ids, applied)}, nil
}

// logRuns reads the groups' latest marks and leased runs (logRuns).
func (s *Store) logRuns(ctx context.Context, tx pgx.Tx, ts, ps, gs []string, parts []int64) (map[logGroupKey]*logRun, []logGroupKey, error) {
	rows, err := tx.Query(ctx, s.lsql.logRuns, ts, ps, gs, parts)
	if err != nil {
		return nil, nil, err
	}
	return readRuns(rows)
}

// readRuns reads logRuns' rows: each group's latest mark and leased run,
// and the groups in order. It closes rows.
func readRuns(rows pgx.Rows) (map[logGroupKey]*logRun, []logGroupKey, error) {
	defer rows.Close()
	runs := map[logGroupKey]*logRun{}
	var order []logGroupKey
	for rows.Next() {
		var g logGroupKey
		var kind, token, owner, id, status *string
		var done, upto, seq *int64
		var at *time.Time
		var attempts, recoveries *int32
		if err := rows.Scan(&g.tenant, &g.topic, &g.grp, &g.part, &kind, &done, &upto, &token, &owner, &at,
			&id, &seq, &status, &attempts, &recoveries); err != nil {
			return nil, nil, err
		}
		r, ok := runs[g]
		if !ok {
			r = &logRun{kind: deref(kind), token: deref(token), owner: deref(owner), at: derefTime(at)}
			if done != nil {
				r.done, r.upto = *done, *upto
			}
			runs[g] = r
			order = append(order, g)
		}
		if id != nil {
			r.rows = append(r.rows, logRunRow{id: *id, seq: *seq, status: *status, attempts: int(*attempts), recoveries: int(*recoveries)})
		}
	}
	return runs, order, rows.Err()
}

// logFinishRun fences the outcomes of one group's run and records what
// they write.
func logFinishRun(w *logWrites, g logGroupKey, r *logRun, byID map[string]outbox.Outcome, owner string, now time.Time, applied map[string]bool, deleteSent map[string]bool) {
	if r.kind != "lease" || r.owner != owner {
		return
	}
	sort.Slice(r.rows, func(i, j int) bool { return r.rows[i].seq < r.rows[j].seq })
	inRun := 0
	var stop int64 // the first message given back, 0: none
	done, open, resolved := r.done, true, true
	for _, row := range r.rows {
		o, ok := byID[row.id]
		if ok && (o.ClaimToken != r.token || row.status != "PENDING" || o.Attempt != row.attempts+1) {
			ok = false
		}
		if !ok {
			resolved = false
			open = false
			continue
		}
		inRun++
		applied[row.id] = true
		finished := o.Kind == outbox.OutcomeSent || (o.Kind == outbox.OutcomeDead && !o.BlockGroup)
		if open && finished {
			done = row.seq
		} else if open {
			open = false
			stop = row.seq
			done = row.seq - 1
		}
		switch o.Kind {
		case outbox.OutcomeSent:
			if deleteSent[g.topic] {
				w.del = append(w.del, row.id)
				continue
			}
			// In the run's order with nothing to keep: the mark says it all.
			if row.seq > done || o.ProviderMessageID != "" || len(o.ProviderResponse) > 0 {
				w.row(o, now)
			}
			if o.Attempt != 1 || row.recoveries != 0 {
				w.history(o, g.tenant, "SUCCEEDED", now)
			}
		case outbox.OutcomeRetry:
			w.wake = true
			w.row(o, now)
			w.history(o, g.tenant, "RETRY", now)
		case outbox.OutcomeDead:
			w.row(o, now)
			w.history(o, g.tenant, "FAILED", now)
		case outbox.OutcomeReleased:
			w.wake = true
			if !o.NextAttemptAt.IsZero() || o.Error != nil {
				w.row(o, now)
			}
		}
	}
	if inRun == 0 {
		return
	}
	switch {
	case stop > 0 || resolved:
		if open {
			done = r.upto
		}
		w.mark(g, "done", done, done, "", "", now)
	default:
		w.mark(g, "lease", done, r.upto, r.token, r.owner, now)
	}
}

// logGroups runs a statement that returns groups (tenant, topic, grp,
// part) and returns them as the arrays the next statements take.
func logGroups(ctx context.Context, tx pgx.Tx, stmt string, args ...any) (ts, ps, gs []string, parts []int64, err error) {
	rows, err := tx.Query(ctx, stmt, args...)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	g, err := readGroups(rows)
	return g.ts, g.ps, g.gs, g.parts, err
}

// readGroups reads rows of groups (tenant, topic, grp, part) as arrays. It
// closes rows.
func readGroups(rows pgx.Rows) (logTakeGroups, error) {
	defer rows.Close()
	var g logTakeGroups
	for rows.Next() {
		var k logGroupKey
		if err := rows.Scan(&k.tenant, &k.topic, &k.grp, &k.part); err != nil {
			return logTakeGroups{}, err
		}
		g.ts, g.ps, g.gs, g.parts = append(g.ts, k.tenant), append(g.ps, k.topic), append(g.gs, k.grp), append(g.parts, k.part)
	}
	return g, rows.Err()
}

// lost lists the ids not in done, in order.
func lost(ids []string, done map[string]bool) []string {
	var out []string
	for _, id := range ids {
		if !done[id] {
			out = append(out, id)
		}
	}
	return out
}

// logFinishPiped is logFinish's transaction on a connection of its own, in
// two or three round trips instead of six: BEGIN, the settings and the
// groups' locks in one batch, with the runs' read when the store knows the
// groups (it claimed the messages: logKnown), else the runs alone; then
// the write with COMMIT. The runs' read runs after the locks (a statement
// of its own, so its snapshot holds every mark committed under them). A
// failed statement's transaction is rolled back (a connection that cannot
// is closed by the pool).
func (s *Store) logFinishPiped(ctx context.Context, a acquirer, ids []string, write func(map[logGroupKey]*logRun, []logGroupKey) []any) (err error) {
	kt, kp, kg, kparts, known := s.logKnown.groups(ids)
	p, br, err := s.logPipeBegin(ctx, a, func(b *pgx.Batch) {
		if known {
			b.Queue(s.lsql.logLockKnown, kt, kp, kg, kparts, s.groupNS+logClaimLockKey)
			b.Queue(s.lsql.logRuns, kt, kp, kg, kparts)
		} else {
			b.Queue(s.lsql.logLockGroups, ids, s.groupNS+logClaimLockKey)
		}
	})
	if err != nil {
		return err
	}
	defer func() { p.end(ctx, err) }()
	conn := p.c.Conn()
	var g logTakeGroups
	var runs map[logGroupKey]*logRun
	var order []logGroupKey
	var rows pgx.Rows
	if rows, err = br.Query(); err == nil {
		g, err = readGroups(rows)
	}
	if err == nil && known {
		if rows, err = br.Query(); err == nil {
			runs, order, err = readRuns(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if !known && len(g.gs) > 0 {
		rows, qerr := conn.Query(ctx, s.lsql.logRuns, g.ts, g.ps, g.gs, g.parts)
		if qerr != nil {
			return qerr
		}
		if runs, order, err = readRuns(rows); err != nil {
			return err
		}
	}
	var args []any
	if len(g.gs) > 0 {
		args = write(runs, order)
	}
	if args == nil {
		_, err = conn.Exec(ctx, "COMMIT")
		p.began = err != nil
		return err
	}
	b := &pgx.Batch{}
	b.Queue(s.lsql.logWrite, args...)
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	if _, err = br.Exec(); err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		p.began = false
	}
	return err
}
