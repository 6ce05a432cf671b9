package postgres

import (
	"context"
	"sort"
	"strings"
	"sync"
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
