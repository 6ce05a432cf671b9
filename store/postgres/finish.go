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
// ClaimedBy = p.Owner, Attempts = the outcome's Attempt); the IDs of the
// others are returned in LeaseLost. Released messages go back to PENDING
// without counting the attempt (deferred ones with their new due time and
// LastError) and wake the other processors.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.FinishResult{}, err
	}
	total := len(p.Outcomes)
	if total == 0 {
		return outbox.FinishResult{}, nil
	}
	now := s.at(p.Now)

	// One array per column and kind: each kind is one UPDATE ... FROM
	// unnest(...) of the statement.
	var (
		sID         []string
		sPMID       []*string
		sResp       []*string
		sAtt        []int32
		sStart      []*time.Time
		rID         []string
		rCode, rMsg []*string
		rResp       []*string
		rAtt        []int32
		rNext       []time.Time
		rStart      []*time.Time
		dID         []string
		dCode, dMsg []*string
		dResp       []*string
		dAtt        []int32
		dStart      []*time.Time
		dBlock      []bool
		lID         []string
		lAtt        []int32
		lNext       []*time.Time
		lHasErr     []bool
		lCode, lMsg []*string
	)
	for _, o := range p.Outcomes {
		att := int32(o.Attempt) //nolint:gosec // attempts are small
		switch o.Kind {
		case outbox.OutcomeSent:
			sID, sAtt = append(sID, o.ID), append(sAtt, att)
			sPMID = append(sPMID, nullText(o.ProviderMessageID))
			sResp, sStart = append(sResp, jsonText(o.ProviderResponse)), append(sStart, nullTime(o.StartedAt))
		case outbox.OutcomeRetry:
			next := o.NextAttemptAt
			if next.IsZero() {
				next = now
			}
			rID, rAtt = append(rID, o.ID), append(rAtt, att)
			rNext = append(rNext, next.UTC().Truncate(time.Microsecond))
			rCode, rMsg = append(rCode, nullText(o.Error.Code)), append(rMsg, nullText(o.Error.Message))
			rResp, rStart = append(rResp, jsonText(o.ProviderResponse)), append(rStart, nullTime(o.StartedAt))
		case outbox.OutcomeDead:
			dID, dAtt = append(dID, o.ID), append(dAtt, att)
			dCode, dMsg = append(dCode, nullText(o.Error.Code)), append(dMsg, nullText(o.Error.Message))
			dResp, dStart = append(dResp, jsonText(o.ProviderResponse)), append(dStart, nullTime(o.StartedAt))
			dBlock = append(dBlock, o.BlockGroup)
		case outbox.OutcomeReleased:
			lID, lAtt = append(lID, o.ID), append(lAtt, att)
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
	mask := 0
	args := []any{now, text(p.Owner), channel}
	if len(sID) > 0 {
		mask |= finishSent
		args = append(args, sID, sAtt, sPMID, sResp, sStart)
	}
	if len(rID) > 0 {
		mask |= finishRetry
		args = append(args, rID, rAtt, rNext, rCode, rMsg, rResp, rStart)
	}
	if len(dID) > 0 {
		mask |= finishDead
		args = append(args, dID, dAtt, dCode, dMsg, dResp, dStart, dBlock)
	}
	if len(lID) > 0 {
		mask |= finishReleased
		args = append(args, lID, lAtt, lNext, lHasErr, lCode, lMsg)
	}
	applied := make(map[string]struct{}, total)
	err := s.planned(ctx, s.sql.finish[mask], args, func(r pgx.Rows) error {
		var id string
		if err := r.Scan(&id); err != nil {
			return err
		}
		applied[id] = struct{}{}
		return nil
	})
	if err != nil {
		return outbox.FinishResult{}, wrapErr("finish", err)
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
			return res, nil
		}
	}
}
