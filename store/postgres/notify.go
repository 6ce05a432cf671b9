package postgres

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Notification coalescing.
//
// PostgreSQL serialises the commits of notifying transactions (each holds
// a cluster-wide lock from its pre-commit until its commit record is
// flushed), so a NOTIFY per enqueueing transaction keeps small
// transactions from sharing WAL flushes. An enqueue therefore notifies
// only when some listener is idle and needs the wake-up:
//
//   - An idle listener holds the store's notify lock: a session-level
//     advisory lock (one bigint key derived from the channel), exclusive.
//   - An enqueue that inserted tries the notify lock in shared mode for
//     its transaction (pg_try_advisory_xact_lock_shared, never waiting). It
//     fails while a listener holds the lock: the enqueue notifies. It
//     succeeds when no listener is idle: the enqueue skips NOTIFY and holds
//     the shared lock until its transaction ends.
//   - A notification makes the holder release the lock and short-poll
//     (busy): every notifyTick it reads the messages' sequence and wakes
//     its processor while new messages are being drawn. After notifyLinger
//     without a new sequence number it tries the lock again. It gets it
//     only when no enqueue that skipped NOTIFY is in flight (all of them
//     committed or rolled back: the lock is released after the commit is
//     visible), then wakes its processor once more: that claim sees every
//     message that skipped its NOTIFY. Until then it keeps polling.
//
// With several listeners (processors) only one holds the lock; the others
// are followers and wake on the notifications the holder's presence
// causes. A holder or busy listener that stops notifies (a holder releases
// the lock first), so the followers re-evaluate; one whose connection dies
// silently, or a follower that settled just before the holder turned busy
// (it read the same notification first) while the busy one's processor
// cannot claim (not the leader), costs at most notifyFollowerRecheck. No listener at all (no
// processor running, Options.DisableNotify on the processors, a pooler
// that never delivers) means no enqueue notifies.
//
// Timings; variables so tests can change them.
var (
	// notifyTick is the short-poll period of a busy listener: a message
	// enqueued while it is busy waits half of it on average before its
	// claim starts (at 10 ms, most of a 7 ms median from commit to
	// publication at 500 msg/s).
	notifyTick = 2 * time.Millisecond
	// notifyStreamTick is the short-poll period while messages are drawn
	// faster than notifyStreamPerTick per notifyTick: the processors'
	// claims are full then, and a tick of notifyTick would cost a read of
	// the sequence per listener every 2 ms for nothing.
	notifyStreamTick    = 10 * time.Millisecond
	notifyStreamPerTick = int64(8)
	// notifyRecentTicks: after the sequence moved, the busy listener wakes
	// its processor at the next tick and then 2, 4 and 8 ticks later (a
	// message whose number was drawn may commit a few milliseconds after),
	// so a transaction slower to commit than a tick is claimed within about
	// its own commit time, not at the next slow tick.
	notifyRecentTicks = 8
	// notifyLingerTicks is how many ticks without a new sequence number a
	// busy listener waits before it tries to become idle again.
	notifyLingerTicks = 15
	// notifySlowTicks: while enqueues that skipped NOTIFY stay in flight
	// but draw no new sequence numbers (long transactions), the busy
	// listener wakes its processor every this many ticks.
	notifySlowTicks = 50
	// notifyFollowerRecheck is how often an idle listener that does not
	// hold the lock checks that some listener still does.
	notifyFollowerRecheck = time.Second
)

// notifyKeyOf is the notify lock's key for a NOTIFY channel.
func notifyKeyOf(channel string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("outboxkit:notify:" + channel))
	return int64(h.Sum64()) //nolint:gosec // a hash, wrapping is intended
}

type listenState int

const (
	listenIdle     listenState = iota // holds the notify lock: enqueues notify
	listenFollower                    // idle; another listener holds the lock
	listenBusy                        // short-polling; enqueues may skip NOTIFY
)

// acquireSQL tries the notify lock: 1 when taken (this session is the
// holder), 2 when enqueues that skipped NOTIFY hold it shared, 3 when
// another listener holds it. CASE fixes the evaluation order.
const acquireSQL = `SELECT CASE
	WHEN pg_try_advisory_lock($1::int8) THEN 1
	WHEN pg_try_advisory_lock_shared($1::int8) THEN CASE WHEN pg_advisory_unlock_shared($1::int8) THEN 2 ELSE 2 END
	ELSE 3 END`

// notifyWatch is a listener connection's part of the protocol above.
type notifyWatch struct {
	s      *Store
	conn   *pgx.Conn
	state  listenState
	seqSQL string // reads the messages' sequence; "" when not readable
	seq    int64  // its last value read
	step   int64  // how far it moved at the last read
	// tickLen is the busy listener's current tick (see period).
	tickLen time.Duration
	quiet   int // busy ticks since the sequence last moved
	next    time.Time
}

func (s *Store) newNotifyWatch(ctx context.Context, conn *pgx.Conn) *notifyWatch {
	w := &notifyWatch{s: s, conn: conn, state: listenBusy}
	// The sequence of the seq column tells a busy listener whether
	// messages are being enqueued. Without the privilege to read it the
	// listener wakes its processor on every tick while busy.
	var name string
	err := conn.QueryRow(ctx, `SELECT s FROM pg_get_serial_sequence($1, 'seq') s
		WHERE has_sequence_privilege(s, 'SELECT')`, s.messages).Scan(&name)
	if err == nil && name != "" {
		w.seqSQL = "SELECT last_value FROM " + name
	}
	_ = w.readSeq(ctx) // the baseline; an error shows again at the next use
	return w
}

// wait is how long the listener waits for a notification before its next
// tick (busy, follower) or health check (idle).
func (w *notifyWatch) wait() time.Duration {
	if w.state == listenIdle {
		return listenHealthInterval
	}
	return max(time.Until(w.next), 0)
}

// settle tries the notify lock and moves to the state its result means.
func (w *notifyWatch) settle(ctx context.Context) error {
	var r int
	if err := w.conn.QueryRow(ctx, acquireSQL, w.s.notifyKey).Scan(&r); err != nil {
		return err
	}
	now := time.Now()
	switch r {
	case 1:
		w.state = listenIdle
	case 3:
		w.state = listenFollower
		w.next = now.Add(notifyFollowerRecheck)
	default:
		if w.state != listenBusy {
			w.quiet = 0
		}
		w.state = listenBusy
		w.next = now.Add(notifyTick)
	}
	return nil
}

// notified handles a notification: the listener becomes busy (a holder
// releases the lock, so enqueues stop notifying) and notes the sequence.
func (w *notifyWatch) notified(ctx context.Context) error {
	if w.state == listenIdle {
		if _, err := w.conn.Exec(ctx, `SELECT pg_advisory_unlock($1::int8)`, w.s.notifyKey); err != nil {
			return err
		}
	}
	if w.state != listenBusy {
		w.state = listenBusy
		w.next = time.Now().Add(notifyTick)
		w.quiet = 0
		if err := w.readSeq(ctx); err != nil {
			return err
		}
	}
	return nil
}

// readSeq reads the sequence; when it moved, quiet restarts at 0.
func (w *notifyWatch) readSeq(ctx context.Context) error {
	if w.seqSQL == "" {
		return nil
	}
	var v int64
	if err := w.conn.QueryRow(ctx, w.seqSQL).Scan(&v); err != nil {
		return err
	}
	w.step = v - w.seq
	if v != w.seq {
		w.seq, w.quiet = v, 0
	}
	return nil
}

// period is the busy listener's next tick: notifyTick, or
// notifyStreamTick while messages stream in.
func (w *notifyWatch) period() time.Duration {
	if w.step > notifyStreamPerTick*int64(max(w.tickLen/notifyTick, 1)) {
		return notifyStreamTick
	}
	return notifyTick
}

// tick runs when a busy listener's tick or a follower's recheck is due. It
// reports whether the processor should be woken.
func (w *notifyWatch) tick(ctx context.Context) (bool, error) {
	if w.state == listenFollower {
		if err := w.settle(ctx); err != nil {
			return false, err
		}
		// Still a follower: nothing to do. Otherwise the holder is gone
		// and messages may have skipped NOTIFY since.
		return w.state != listenFollower, nil
	}
	w.quiet++
	if err := w.readSeq(ctx); err != nil {
		return false, err
	}
	w.tickLen = w.period()
	w.next = time.Now().Add(w.tickLen)
	// A message that drew its number in the last ticks is probably
	// committing now: claim, at 1, 2, 4 and 8 ticks after the move.
	recent := w.seqSQL == "" || w.quiet <= notifyRecentTicks && w.quiet&(w.quiet-1) == 0
	if w.seqSQL != "" && w.quiet < notifyLingerTicks {
		return recent, nil
	}
	if err := w.settle(ctx); err != nil {
		return false, err
	}
	if w.state != listenBusy {
		// Idle (or following): every enqueue that skipped NOTIFY has
		// ended; one more claim sees those that committed.
		return true, nil
	}
	return recent || w.quiet%notifySlowTicks == 0, nil
}

// leave runs when the listener stops. A holder releases the lock and
// notifies, and so does a busy listener (enqueues may be skipping NOTIFY
// because of it): the followers re-evaluate at once.
func (w *notifyWatch) leave(ctx context.Context) {
	if w.state == listenFollower {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = w.conn.Exec(cctx, `SELECT CASE WHEN $3 THEN pg_advisory_unlock($1::int8) END, pg_notify($2, '')`,
		w.s.notifyKey, w.s.channel, w.state == listenIdle)
}
