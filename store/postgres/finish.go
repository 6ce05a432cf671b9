package postgres

import (
	"cmp"
	"context"
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
	channel := s.channel
	if s.opts.DisableNotify {
		channel = ""
	}
	// withTID appends a kind's tuple IDs when the rows are found by them.
	withTID := func(args []any, t []string) []any {
		if tids != nil {
			args = append(args, t)
		}
		return args
	}
	mask := 0
	args := []any{now, text(owner), channel}
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
	maxRecoveries := cmp.Or(p.MaxRecoveries, outbox.DefaultMaxRecoveries)
	now := s.at(p.Now)
	before := p.ClaimedBefore.UTC().Truncate(time.Microsecond)
	const chunk = 10000
	def, block, cont := p.DeadLetter.BlockingTopics()
	block, cont = texts(block), texts(cont)
	var res outbox.RecoverResult
	for {
		var rec, dead int
		var sc *string
		err := s.planned(ctx, s.sql.recover, []any{before, now, maxRecoveries, chunk, def, block, cont}, func(r pgx.Rows) error {
			return r.Scan(&rec, &dead, &sc)
		})
		if err != nil {
			return res, wrapErr("recover", err)
		}
		res.Recovered += rec
		res.DeadLettered += dead
		if rec+dead < chunk {
			break
		}
	}
	if s.logMode {
		lr, err := s.logRecoverLeases(ctx, before, now, maxRecoveries, def, block, cont)
		res.Recovered += lr.Recovered
		res.DeadLettered += lr.DeadLettered
		if err != nil {
			return res, err
		}
	}
	return res, nil
}
