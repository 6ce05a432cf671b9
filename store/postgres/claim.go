package postgres

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

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
// messages, so no group starves behind blocked ones.
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
	now := s.at(p.Now)
	owner := text(p.Owner)
	budget := min(max(4*p.Limit, 1000), 20000)
	run := min(s.opts.ClaimPerGroup, p.Limit)

	stmt, fb := s.sql.claimAll, s.sql.claimFallbackAll
	args := []any{now, owner, p.Limit, budget, run}
	if len(p.Topics) > 0 {
		stmt, fb = s.sql.claimTopics, s.sql.claimFallbackTopics
		args = append(args, p.Topics)
	}
	settings := planSettings
	if s.smallClaims.Load() {
		settings = claimSettings
	}
	msgs, scanned, maxSeq, err := s.claim(ctx, settings, stmt, args)
	if err != nil {
		return nil, err
	}
	s.smallClaims.Store(len(msgs) < smallClaim)
	if len(msgs) < p.Limit && scanned >= int64(budget) {
		args[2] = p.Limit - len(msgs)
		args[3] = maxSeq
		more, _, _, err := s.claim(ctx, planSettings, fb, args)
		if err != nil {
			// The first claim is committed: hand it out rather than leave
			// it to lease recovery.
			s.log.WarnContext(ctx, "outboxkit/postgres: fallback claim failed", "err", err)
		}
		msgs = append(msgs, more...)
		sort.Slice(msgs, func(i, j int) bool { return msgs[i].Seq < msgs[j].Seq })
	}
	return msgs, nil
}

func (s *Store) claim(ctx context.Context, settings, stmt string, args []any) ([]outbox.Message, int64, int64, error) {
	var (
		msgs            []outbox.Message
		scanned, maxSeq int64
		tid             *string
	)
	err := s.plannedWith(ctx, settings, stmt, args, func(r pgx.Rows) error {
		var row msgRow
		if r.RawValues()[2] == nil { // no message claimed: only the window's figures
			dest := make([]any, 3+len(row.dest()))
			dest[0], dest[1] = &scanned, &maxSeq
			return r.Scan(dest...)
		}
		dest := append([]any{&scanned, &maxSeq}, row.dest()...)
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
		return msgs, 0, 0, wrapErr("claim", err)
	}
	return msgs, scanned, maxSeq, nil
}
