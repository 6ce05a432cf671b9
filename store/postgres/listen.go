package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/elect"
)

// Listener timings; variables so tests can shorten them.
var (
	// listenSelfTestTimeout bounds the wait for the listener's own test
	// notification. A transaction-mode pooler (PgBouncer) accepts LISTEN
	// but never delivers: the self-test times out and the store polls.
	listenSelfTestTimeout = 3 * time.Second
	// listenHealthInterval is how long the listener waits for a
	// notification before it pings its connection.
	listenHealthInterval = 15 * time.Second
	// listenRetryMin and listenRetryMax bound the reconnect backoff.
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 10 * time.Second
	// listenNoDeliveryRetry is how long the listener waits before it tries
	// again after its self-test failed.
	listenNoDeliveryRetry = 5 * time.Minute
)

// listenAppName starts the application_name of a listener connection; the
// NOTIFY channel follows.
const listenAppName = "outboxkit listener "

var errNoDelivery = errors.New("LISTEN was accepted but the test notification never arrived (a transaction-mode pooler such as PgBouncer?)")

// Wakeups implements outbox.Waker: the returned channel receives a value
// soon after a transaction that enqueued (or a requeue or release) commits,
// through LISTEN/NOTIFY on a dedicated connection (see Options.Connect).
// Bursts are coalesced (the channel holds at most one value). The channel
// is closed when ctx ends.
//
// After a notification the listener short-polls: while messages keep
// being enqueued it wakes the processor every 10 ms, and enqueues skip
// their NOTIFY (PostgreSQL serialises notifying commits, so a NOTIFY per
// small transaction costs enqueue throughput). Once enqueues stop and every
// transaction that skipped its NOTIFY has ended, it wakes the processor
// once more and goes back to waiting for notifications. No wake-up is
// lost on the way: see notify.go.
//
// The listener checks at start that notifications really arrive; when they
// do not (a transaction-mode pooler between the application and
// PostgreSQL) or no dedicated connection can be had, it logs one line and
// the processor keeps working on its poll interval. A lost connection is
// re-established with backoff, and a wake-up is sent after each reconnect
// so nothing committed in between waits for the next poll.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} {
	ch, _ := s.WakeupsLive(ctx)
	return ch
}

// WakeupsLive implements outbox.LiveWaker: it is Wakeups, with a function
// that reports whether the listener is up (it LISTENs, and its own test
// notification arrived). A listener whose connection died silently counts
// as up until it notices: its ping, after listenHealthInterval (15s)
// without a notification, fails within 5s.
func (s *Store) WakeupsLive(ctx context.Context) (<-chan struct{}, func() bool) {
	ch := make(chan struct{}, 1)
	live := new(atomic.Bool)
	s.wakers.add(ch)
	go s.listenLoop(ctx, ch, live)
	return ch, live.Load
}

// wakerSet is the channels of the running Wakeups calls.
type wakerSet struct {
	mu  sync.Mutex
	chs map[chan struct{}]struct{}
}

func (w *wakerSet) add(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.chs == nil {
		w.chs = map[chan struct{}]struct{}{}
	}
	w.chs[ch] = struct{}{}
}

// remove forgets ch; the caller closes it after.
func (w *wakerSet) remove(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.chs, ch)
}

// wakeAll wakes every running Wakeups channel.
func (w *wakerSet) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.chs {
		wake(ch)
	}
}

func wake(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleepCtx is elect.Sleep: it sleeps for d or until ctx ends and reports
// whether ctx is still alive. The listener and the Elector call it.
var sleepCtx = elect.Sleep

// listenLoop listens until ctx ends, reconnecting; live is set while a
// listener is up, cleared before the wake-up that follows its loss.
func (s *Store) listenLoop(ctx context.Context, ch chan struct{}, live *atomic.Bool) {
	defer func() {
		s.wakers.remove(ch)
		close(ch)
	}()
	if s.opts.DisableNotify {
		s.log.InfoContext(ctx, "outboxkit/postgres: notifications are disabled (Options.DisableNotify): polling only")
		<-ctx.Done()
		return
	}
	backoff := listenRetryMin
	connected := false
	for ctx.Err() == nil {
		conn, err := s.dedicated(ctx)
		if errors.Is(err, errNoDedicated) {
			s.log.WarnContext(ctx, "outboxkit/postgres: no dedicated connection for LISTEN (DB is not a *pgxpool.Pool and Options.Connect is nil): polling only")
			<-ctx.Done()
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.WarnContext(ctx, "outboxkit/postgres: listener cannot connect, polling until it can", "err", err, "retry_in", backoff)
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, listenRetryMax)
			continue
		}
		err = s.listenOn(ctx, conn, ch, func() {
			backoff = listenRetryMin
			if connected {
				s.log.InfoContext(ctx, "outboxkit/postgres: listener reconnected")
			}
			connected = true
			live.Store(true)
		})
		live.Store(false)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoDelivery) {
			s.log.WarnContext(ctx, "outboxkit/postgres: notifications do not arrive, polling only", "reason", err.Error(), "retry_in", listenNoDeliveryRetry)
			if !sleepCtx(ctx, listenNoDeliveryRetry) {
				return
			}
			continue
		}
		s.log.WarnContext(ctx, "outboxkit/postgres: listener lost its connection, polling until it reconnects", "err", err, "retry_in", backoff)
		wake(ch)
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, listenRetryMax)
	}
}

// listenOn LISTENs on conn, checks delivery, then forwards notifications to
// ch until ctx ends or the connection fails.
func (s *Store) listenOn(ctx context.Context, conn *pgx.Conn, ch chan struct{}, up func()) error {
	// Named in pg_stat_activity (its last query changes every tick while
	// it short-polls). One round trip for both: a fleet starts a listener
	// per database.
	b := &pgx.Batch{}
	b.Queue("LISTEN " + pgx.Identifier{s.channel}.Sanitize())
	b.Queue(`SELECT set_config('application_name', left($1, 63), false)`, listenAppName+s.channel)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	// Self-test: a notification sent through the DB (another connection)
	// must reach this one.
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	token := "outboxkit-selftest-" + hex.EncodeToString(nonce[:])
	if err := s.notifyOther(ctx, token); err != nil {
		return err
	}
	deadline := time.Now().Add(listenSelfTestTimeout)
	for {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if time.Now().After(deadline) {
				return errNoDelivery
			}
			return err
		}
		if n.Payload == token {
			break
		}
		wake(ch) // a real notification arrived first
	}
	up()
	// The first settle takes the notify lock when no enqueue that skipped
	// NOTIFY is in flight; its wake-up covers anything committed while we
	// were not listening.
	w := s.newNotifyWatch(ctx, conn)
	defer w.leave(ctx)
	if err := w.settle(ctx); err != nil {
		return err
	}
	wake(ch)
	for {
		wctx, cancel := context.WithTimeout(ctx, w.wait())
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			wake(ch)
			if err := w.notified(ctx); err != nil {
				return err
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) || pgconnTimeout(err):
			if w.state != listenIdle {
				woke, err := w.tick(ctx)
				if err != nil {
					return err
				}
				if woke {
					wake(ch)
				}
				continue
			}
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			perr := conn.Ping(pctx)
			pcancel()
			if perr != nil {
				return perr
			}
		default:
			return err
		}
	}
}

func pgconnTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// notifyOther sends payload on the store's channel from a connection other
// than the listener's: the pool when DB is one (safe for concurrent use),
// else a short-lived connection from Options.Connect (a single *pgx.Conn
// DB belongs to the application and must not be used concurrently).
func (s *Store) notifyOther(ctx context.Context, payload string) error {
	if _, ok := s.db.(acquirer); ok || s.opts.Connect == nil {
		_, err := s.db.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, payload)
		return err
	}
	c, err := s.opts.Connect(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	_, err = c.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, payload)
	return err
}
