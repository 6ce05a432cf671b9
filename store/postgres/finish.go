package postgres

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageFinish records a batch of outcomes of one owner in one statement:
// one UPDATE ... FROM unnest(...) per kind plus the attempt rows, atomically.
// Each outcome applies only while the lease holds (status PROCESSING,
// ClaimedBy = p.Owner, Attempts = the outcome's Attempt, claim_token = the
// outcome's ClaimToken, NULL for ""); the IDs of the others are returned in
// LeaseLost. Released messages go back to PENDING
// without counting the attempt (deferred ones with their new due time and
// LastError) and wake the other processors.
//
// The rows of messages this store leased are found by the tuple ID the claim
// (or the last lease renewal) returned, without a primary-key descent; the
// outcomes whose row has moved since, or that this store did not lease, are
// then written by message ID in a second statement (a second round trip
// only then). When that second statement fails, the first one's outcomes
// are committed: the call returns the error, and a retry of the same
// outcomes by the same owner reports them applied (not lost), unless this
// store leased those messages again in between.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.FinishResult{}, err
	}
	total := len(p.Outcomes)
	if total == 0 {
		return outbox.FinishResult{}, nil
	}
	if s.logMode {
		return s.logFinish(ctx, p)
	}
	now := s.at(p.Now)
	applied := make(map[string]struct{}, total)
	hinted, tids, byID := s.tids.split(p.Owner, p.Outcomes, applied)
	if len(hinted) > 0 {
		if err := s.finish(ctx, now, p.Owner, hinted, tids, applied); err != nil {
			return outbox.FinishResult{}, err
		}
		if len(applied) < len(hinted) {
			for _, o := range hinted {
				if _, ok := applied[o.ID]; !ok {
					byID = append(byID, o)
				}
			}
		}
	}
	if len(byID) > 0 {
		if err := s.finish(ctx, now, p.Owner, byID, nil, applied); err != nil {
			// The outcomes in applied are committed: the caller retries the
			// batch, and must hear that they were written (its observers
			// report them), not that their leases were lost.
			for _, o := range p.Outcomes {
				if _, ok := applied[o.ID]; ok {
					s.tids.wrote(p.Owner, o)
				}
			}
			return outbox.FinishResult{}, err
		}
	}
	var res outbox.FinishResult
	if len(applied) < total {
		for _, o := range p.Outcomes {
			if _, ok := applied[o.ID]; !ok {
				res.LeaseLost = append(res.LeaseLost, o.ID)
			}
		}
	}
	return res, nil
}

// finish runs the outcome statement for outcomes, found by tuple ID
// (tids[i] for outcomes[i]) when tids is not nil, and adds the IDs it
// applied to applied.
func (s *Store) finish(ctx context.Context, now time.Time, owner string, outcomes []outbox.Outcome, tids []string, applied map[string]struct{}) error {
	mask, args := s.finishArgs(now, owner, outcomes, tids)
	stmt, settings := s.sql.finish[mask], planSettings
	if tids != nil {
		stmt, settings = s.sql.finishTID[mask], tidGenericSettings
		if mask&finishSent != 0 && len(s.opts.DeleteSentTopics) > 0 {
			settings = tidSettings // see tidGenericSettings
		}
	}
	err := s.plannedWith(ctx, settings, stmt, args, func(r pgx.Rows) error {
		var id string
		if err := r.Scan(&id); err != nil {
			return err
		}
		applied[id] = struct{}{}
		return nil
	})
	if err != nil {
		return wrapErr("finish", err)
	}
	return nil
}

// finishArgs returns the variant of the outcome statement (finishSQL's
// mask) that outcomes need and its arguments, with the tuple IDs tids when
// it is not nil.
func (s *Store) finishArgs(now time.Time, owner string, outcomes []outbox.Outcome, tids []string) (mask int, args []any) {
	// One array per column and kind: each kind is one UPDATE ... FROM
	// unnest(...) of the statement.
	var (
		sID         []string
		sTok        []*string
		sPMID       []*string
		sResp       []*string
		sAtt        []int32
		sStart      []*time.Time
		sTID        []string
		rID         []string
		rTok        []*string
		rCode, rMsg []*string
		rResp       []*string
		rAtt        []int32
		rNext       []time.Time
		rStart      []*time.Time
		rTID        []string
		dID         []string
		dTok        []*string
		dCode, dMsg []*string
		dResp       []*string
		dAtt        []int32
		dStart      []*time.Time
		dBlock      []bool
		dTID        []string
		lID         []string
		lTok        []*string
		lAtt        []int32
		lNext       []*time.Time
		lHasErr     []bool
		lCode, lMsg []*string
		lTID        []string
	)
	for i, o := range outcomes {
		att := int32(o.Attempt) //nolint:gosec // attempts are small
		tok := nullText(o.ClaimToken)
		tid := ""
		if tids != nil {
			tid = tids[i]
		}
		switch o.Kind {
		case outbox.OutcomeSent:
			sID, sAtt, sTok, sTID = append(sID, o.ID), append(sAtt, att), append(sTok, tok), append(sTID, tid)
			sPMID = append(sPMID, nullText(o.ProviderMessageID))
			sResp, sStart = append(sResp, jsonText(o.ProviderResponse)), append(sStart, nullTime(o.StartedAt))
		case outbox.OutcomeRetry:
			next := o.NextAttemptAt
			if next.IsZero() {
				next = now
			}
			rID, rAtt, rTok, rTID = append(rID, o.ID), append(rAtt, att), append(rTok, tok), append(rTID, tid)
			rNext = append(rNext, next.UTC().Truncate(time.Microsecond))
			rCode, rMsg = append(rCode, nullText(o.Error.Code)), append(rMsg, nullText(o.Error.Message))
			rResp, rStart = append(rResp, jsonText(o.ProviderResponse)), append(rStart, nullTime(o.StartedAt))
		case outbox.OutcomeDead:
			dID, dAtt, dTok, dTID = append(dID, o.ID), append(dAtt, att), append(dTok, tok), append(dTID, tid)
			dCode, dMsg = append(dCode, nullText(o.Error.Code)), append(dMsg, nullText(o.Error.Message))
			dResp, dStart = append(dResp, jsonText(o.ProviderResponse)), append(dStart, nullTime(o.StartedAt))
			dBlock = append(dBlock, o.BlockGroup)
		case outbox.OutcomeReleased:
			lID, lAtt, lTok, lTID = append(lID, o.ID), append(lAtt, att), append(lTok, tok), append(lTID, tid)
			lNext = append(lNext, nullTime(o.NextAttemptAt))
			hasErr := o.Error != nil && !o.NextAttemptAt.IsZero()
			lHasErr = append(lHasErr, hasErr)
			if hasErr {
				lCode, lMsg = append(lCode, nullText(o.Error.Code)), append(lMsg, nullText(o.Error.Message))
			} else {
				lCode, lMsg = append(lCode, nil), append(lMsg, nil)
			}
		}
	}
	channel := s.notifyChannel()
	// withTID appends a kind's tuple IDs when the rows are found by them.
	withTID := func(args []any, t []string) []any {
		if tids != nil {
			args = append(args, t)
		}
		return args
	}
	args = []any{now, text(owner), channel}
	if len(sID) > 0 {
		mask |= finishSent
		args = withTID(append(args, sID, sAtt, sTok, sPMID, sResp, sStart), sTID)
		if len(s.opts.DeleteSentTopics) > 0 {
			args = append(args, s.opts.DeleteSentTopics)
		}
	}
	if len(rID) > 0 {
		mask |= finishRetry
		args = withTID(append(args, rID, rAtt, rTok, rNext, rCode, rMsg, rResp, rStart), rTID)
	}
	if len(dID) > 0 {
		mask |= finishDead
		args = withTID(append(args, dID, dAtt, dTok, dCode, dMsg, dResp, dStart, dBlock), dTID)
	}
	if len(lID) > 0 {
		mask |= finishReleased
		args = withTID(append(args, lID, lAtt, lTok, lNext, lHasErr, lCode, lMsg), lTID)
	}
	return mask, args
}

// MessageRecover puts back to PENDING the PROCESSING messages claimed before
// p.ClaimedBefore (their processor died or lost its lease) without counting
// the lost attempt, counts the recovery, and dead-letters instead a message
// whose recoveries reach p.MaxRecoveries (outbox.DefaultMaxRecoveries when
// 0); each lost claim is kept as a "lease_expired" attempt row. It works in
// chunks of 10,000 rows per statement, skipping rows a concurrent outcome is
// writing.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.RecoverResult{}, err
	}
	return s.recoverWith(ctx, s.recoverSpec(p), s.logRecoverLeases)
}

// recoverWith runs the recovery r on the messages table and, on the
// append-only path, logPart on the marks, and adds their results.
func (s *Store) recoverWith(ctx context.Context, r recoverArgs, logPart func(context.Context, recoverArgs) (outbox.RecoverResult, error)) (outbox.RecoverResult, error) {
	res, err := s.recoverLeases(ctx, r)
	if err != nil || !s.logMode {
		return res, err
	}
	lr, err := logPart(ctx, r)
	res.Recovered += lr.Recovered
	res.DeadLettered += lr.DeadLettered
	return res, err
}

// recoverArgs are a recovery's arguments, as its statements take them.
type recoverArgs struct {
	before, now   time.Time
	maxRecoveries int
	def           bool
	block, cont   []string
}

// recoverSpec returns the arguments of the recovery p asks for.
func (s *Store) recoverSpec(p outbox.MessageRecoverParams) recoverArgs {
	def, block, cont := p.DeadLetter.BlockingTopics()
	return recoverArgs{
		before: p.ClaimedBefore.UTC().Truncate(time.Microsecond), now: s.at(p.Now),
		maxRecoveries: cmp.Or(p.MaxRecoveries, outbox.DefaultMaxRecoveries),
		def:           def, block: texts(block), cont: texts(cont),
	}
}

// recoverLeases is MessageRecover's part on the messages table (the
// default path's leases).
func (s *Store) recoverLeases(ctx context.Context, r recoverArgs) (outbox.RecoverResult, error) {
	const chunk = 10000
	var res outbox.RecoverResult
	for {
		var rec, dead int
		var sc *string
		err := s.planned(ctx, s.sql.recover, []any{r.before, r.now, r.maxRecoveries, chunk, r.def, r.block, r.cont}, func(r pgx.Rows) error {
			return r.Scan(&rec, &dead, &sc)
		})
		if err != nil {
			return res, wrapErr("recover", err)
		}
		res.Recovered += rec
		res.DeadLettered += dead
		if rec+dead < chunk {
			return res, nil
		}
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

// recoverSQL is the recovery: an expired lease goes back to PENDING
// without its attempt counted (the processor that held it may never have
// published it) and with one more recovery; the recovery that reaches $3
// (MaxRecoveries) dead-letters it instead. Either way the lost claim is
// kept as an attempts row numbered like the claim.
const recoverSQL = `WITH exp AS (
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
SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'FAILED'), min({ASYNC}) FROM upd`
