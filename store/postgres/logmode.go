package postgres

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// logSQL holds the append-only path's statements, rendered once for the
// store's tables.
type logSQL struct {
	logCandidates, logTake, logBackstop string
	logLockGroups, logLockKnown         string
	logRuns, logWrite                   string
	logExpired, logRecover              string
	logWake                             string
	// The operator's statements, for the append-only path: a cancel
	// checks the message's state through the view; a requeue moves an
	// unordered dead letter to the end too (its own group's done mark has
	// passed its old place).
	cancel, requeue string
	// The prune of the messages the marks finished, whose rows are still
	// PENDING (logprune.go).
	pruneGroups, pruneUnordered string
	// enqueue registers each ordered group the first time it is enqueued
	// to (the backstop's list); sqlText's other statements are unused.
	enqueue sqlText
}

// marks, groups and the state view of the append-only path (migration 13).
func (s *Store) marksTable() string  { return s.schema + "." + s.prefix + "marks" }
func (s *Store) groupsTable() string { return s.schema + "." + s.prefix + "groups" }
func (s *Store) stateView() string   { return s.schema + "." + s.prefix + "message_state" }

func buildLogSQL(s *Store) logSQL {
	r := strings.NewReplacer("{T}", s.messages, "{K}", s.marksTable(), "{G}", s.groupsTable(), "{P}", s.pauses,
		"{A}", s.attempts, "{CLAIMED}", claimedCols())
	q := r.Replace
	var enq sqlText
	for v, stmt := range s.sql.enqueue {
		enq.enqueue[v] = strings.Replace(stmt, "), ins AS (", `), reg AS (
	-- The group registry (append-only path): a probe, and an insert the
	-- first time only.
	INSERT INTO `+s.groupsTable()+` (tenant, topic, grp)
	SELECT DISTINCT i.tenant, i.topic, i.grp FROM input i CROSS JOIN locks l WHERE i.grp <> '' AND l.n >= 0
	ON CONFLICT DO NOTHING
), ins AS (`, 1)
	}
	return logSQL{
		enqueue:        enq,
		logCandidates:  q(logCandidates),
		logTake:        q(logTake),
		logBackstop:    q(logBackstop),
		logLockGroups:  q(logLockGroups),
		logLockKnown:   q(logLockKnown),
		logRuns:        q(logRuns),
		logWrite:       q(logWrite),
		logExpired:     q(logExpired),
		logRecover:     q(logRecover),
		logWake:        q(logWake),
		pruneGroups:    q(logPruneGroups),
		pruneUnordered: q(logPruneUnordered),
		cancel: strings.Replace(s.sql.cancel, "AND status IN ('PENDING', 'FAILED')",
			"AND status IN ('PENDING', 'FAILED') AND id IN (SELECT v.id FROM "+s.stateView()+
				" v WHERE v.tenant = $1 AND v.id = $2 AND v.status IN ('PENDING', 'FAILED'))", 1),
		requeue: strings.NewReplacer("(old.blocks_group OR old.grp = '')", "old.blocks_group",
			"NOT old.blocks_group AND old.grp <> ''", "NOT old.blocks_group").Replace(s.sql.requeue),
	}
}

// enableLogMode switches the store to the append-only path (issue #28):
// claims and outcomes write marks, and reads see messages through the
// state view. Options.AppendOnly turns it on (and records it in the
// database); the tests and outboxbench -pg-log also turn it on without the
// record.
func (s *Store) enableLogMode() {
	s.logMode = true
	s.lsql = buildLogSQL(s)
	s.deleteSent = map[string]bool{}
	for _, t := range s.opts.DeleteSentTopics {
		s.deleteSent[t] = true
	}
	s.lread = buildSQL(&Store{opts: s.opts, messages: s.stateView(), attempts: s.attempts, pauses: s.pauses})
	r := strings.NewReplacer("{T}", s.messages, "{K}", s.marksTable(), "{G}", s.groupsTable())
	s.lread.pendingTopics = r.Replace(logPendingTopics)
	// Counts read each group's latest mark once (logStates), not once
	// per row as the state view does.
	s.lread.count = "SELECT status, count(*) FROM " + s.logStates(" WHERE tenant = $1") + " GROUP BY status"
	s.lread.countAll = "SELECT status, count(*) FROM " + s.logStates("") + " GROUP BY status"
}

// readTable is the table the reads of messages' states use: the state view
// on the append-only path, the messages table otherwise.
func (s *Store) readTable() string {
	if s.logMode {
		return s.stateView()
	}
	return s.messages
}

// logStates is a FROM item of the messages matching where (a WHERE clause
// over the messages table's columns, or "") with their topic, status and
// creation time, the status from the group's latest mark, read once per
// group: for whole-table reads (MessageCount, the admin's topic
// statistics), where the state view's lookup per row would cost a descent
// of the marks index per message.
func (s *Store) logStates(where string) string {
	and := " AND "
	if where == "" {
		where, and = " WHERE ", ""
	}
	return `(WITH lm AS MATERIALIZED (
	-- In the key index's order, the few marks of a key sorted (a
	-- collision of keys keeps its groups apart).
	SELECT DISTINCT ON (gk, part, tenant, topic, grp) gk, tenant, topic, grp, part, kind, done, upto FROM ` + s.marksTable() + `
	ORDER BY gk, part, tenant, topic, grp, mseq DESC
)
SELECT topic, status, created_at FROM ` + s.messages + where + and + `status <> 'PENDING'
UNION ALL
SELECT m.topic, CASE WHEN m.seq <= k.done THEN 'SENT' WHEN k.kind = 'lease' AND m.seq <= k.upto THEN 'PROCESSING' ELSE 'PENDING' END,
	m.created_at
FROM (SELECT * FROM ` + s.messages + where + and + `status = 'PENDING') m
LEFT JOIN lm k ON k.gk = hashtextextended(m.tenant || chr(31) || m.topic || chr(31) || m.grp, 0) AND k.tenant = m.tenant AND k.topic = m.topic AND k.grp = m.grp
	AND k.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END) st`
}

// logPendingTopics is pendingTopicsSQL on the append-only path, where a
// finished message's row stays PENDING: per registered group of a topic
// not in $2, the waiting messages past its latest mark's done and outside
// its live lease; and the unordered messages of those topics whose latest
// mark neither leases nor finishes them. Its cost follows the groups and
// the topics' unordered messages, not the ordered history.
const logPendingTopics = `SELECT topic, sum(n)::bigint, min(oldest) FROM (
	SELECT g.topic, c.n, c.oldest FROM (SELECT tenant, topic, grp, 0::bigint AS part FROM {G}) g
	LEFT JOIN LATERAL (` + logLatest + `) k ON true
	CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(b.next_attempt_at) AS oldest FROM {T} b
		WHERE b.tenant = g.tenant AND b.topic = g.topic AND b.grp = g.grp
			AND (b.status = 'PENDING' OR b.blocks_group) AND b.grp <> '' AND b.seq > coalesce(k.done, 0)
			AND b.status = 'PENDING' AND b.next_attempt_at <= $1
			AND NOT coalesce(k.kind = 'lease' AND b.seq <= k.upto, false)) c
	WHERE g.topic <> ALL($2::text[]) AND c.n > 0
	UNION ALL
	SELECT u.topic, count(*), min(u.next_attempt_at) FROM {T} u
	LEFT JOIN LATERAL (SELECT k.kind, k.done FROM {K} k
		WHERE k.gk = hashtextextended(u.tenant || chr(31) || u.topic || chr(31) || '', 0) AND k.part = u.seq AND k.tenant = u.tenant AND k.topic = u.topic AND k.grp = ''
		ORDER BY k.gk, k.part, k.mseq DESC LIMIT 1) k ON true
	WHERE u.status = 'PENDING' AND u.grp = '' AND u.claimed_by IS NULL AND u.next_attempt_at <= $1
		AND u.topic <> ALL($2::text[]) AND (k.kind IS NULL OR (k.kind = 'done' AND k.done < u.seq))
	GROUP BY u.topic
) x
GROUP BY topic
ORDER BY topic`

// reads returns the read statements: over the state view on the
// append-only path, over the messages table otherwise.
func (s *Store) reads() *sqlText {
	if s.logMode {
		return &s.lread
	}
	return &s.sql
}

// logWake inserts a done mark, at the group's current done, for each group
// of the messages ids whose latest mark is not a lease: an operator's
// change (a cancel, a requeue) that may free a group is then seen by every
// store's next claim, through the marks window. The caller holds the
// groups' claim locks (logLockGroups), so no claim's lease can be passed
// over.
const logWake = `INSERT INTO {K} (tenant, topic, grp, part, kind, done, upto, at)
SELECT g.tenant, g.topic, g.grp, g.part, 'done', coalesce(k.done, 0), coalesce(k.done, 0), $2
FROM (SELECT DISTINCT tenant, topic, grp, CASE WHEN grp = '' THEN seq ELSE 0 END AS part FROM {T}
	WHERE id = ANY($1::text[])) g
LEFT JOIN LATERAL (` + logLatest + `) k ON true
WHERE k.kind IS DISTINCT FROM 'lease'`

// logOperate runs an operator's change of the messages ids on the
// append-only path: in one transaction, with their groups' claim locks
// held (so no claim or outcome runs beside it), then wakes their groups.
func (s *Store) logOperate(ctx context.Context, ids []string, now time.Time, fn func(tx pgx.Tx) error) error {
	return s.logDurableTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.lsql.logLockGroups, ids, s.groupNS+logClaimLockKey)
		if err != nil {
			return err
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, s.lsql.logWake, ids, now)
		return err
	})
}

// enqueueSQL holds the enqueue statements of the store's path for msgs:
// on the append-only path, those that register the groups, unless the
// store knows every ordered group of msgs is registered already (then the
// default path's, which are the same without the registry's probe).
func (s *Store) enqueueSQL(msgs []outbox.Message) *sqlText {
	if s.logMode && !s.logReg.all(msgs) {
		return &s.lsql.enqueue
	}
	return &s.sql
}

// logRegisteredCap bounds logRegistered: past it, the store learns no more
// groups, and enqueues to the others keep probing the registry.
const logRegisteredCap = 1 << 16

// logRegistered is the ordered groups this store knows the group registry
// holds, committed: the groups of messages it claimed (committed, so their
// enqueue's registration is), and of the enqueues it committed itself
// (MessageEnqueue). A registry row is never deleted on the append-only
// path, so an enqueue whose ordered groups are all known skips the
// registry's probe (a unique-index descent and a heap check per group, a
// tenth of an enqueue's buffer accesses). An enqueue in the caller's
// transaction teaches nothing: it may roll back. Migrate forgets them all
// (a migration down past version 13 drops the registry).
type logRegistered struct {
	mu sync.Mutex
	m  map[logRegKey]struct{}
}

type logRegKey struct{ tenant, topic, grp string }

// all reports whether every ordered group of msgs is known.
func (r *logRegistered) all(msgs []outbox.Message) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range msgs {
		if g := msgs[i].Group; g != "" {
			if _, ok := r.m[logRegKey{msgs[i].Tenant, msgs[i].Topic, g}]; !ok {
				return false
			}
		}
	}
	return true
}

// add records the ordered groups of msgs, whose registration committed.
func (r *logRegistered) add(msgs []outbox.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[logRegKey]struct{})
	}
	for i := range msgs {
		if len(r.m) >= logRegisteredCap {
			return
		}
		if g := msgs[i].Group; g != "" {
			r.m[logRegKey{msgs[i].Tenant, msgs[i].Topic, g}] = struct{}{}
		}
	}
}

// forget drops every known group.
func (r *logRegistered) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m = nil
}

// notifyChannel is the NOTIFY channel, "" with Options.DisableNotify.
func (s *Store) notifyChannel() string {
	if s.opts.DisableNotify {
		return ""
	}
	return s.channel
}
