package postgres

import (
	"context"
	"errors"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/elect"
	"github.com/outboxkit/outboxkit/internal/surface"
)

// Every store offers an Elector of the same shape.
var (
	_ surface.Elector                            = (*Elector)(nil)
	_ surface.Electing[ElectorOptions, *Elector] = (*Store)(nil)
)

// ElectorOptions configures an Elector. The zero value is valid.
type ElectorOptions struct {
	// Name tells independent elections on one outbox apart (one per
	// processor role). Defaults to "processor".
	Name string
	// RetryInterval is how often a follower tries to become leader.
	// Defaults to 5 s.
	RetryInterval time.Duration
	// CheckInterval is how often the leader checks that it still holds its
	// lock's connection; a failed check ends its leadership at once. A
	// check waits for the server up to CheckInterval or 5 s, whichever is
	// longer, so that a slow moment does not end the leadership (a check
	// cut off closes the connection, and with it the lock). Defaults to
	// 2 s.
	CheckInterval time.Duration
}

// Elector elects one leader among the replicas that run it on the same
// outbox (seed 004's "primary only" mode). The leader holds a session-level
// PostgreSQL advisory lock on a dedicated connection (see Options.Connect);
// when its process dies or its connection breaks, PostgreSQL releases the
// lock and a follower takes over within its RetryInterval.
//
//	el := store.Elector(postgres.ElectorOptions{})
//	err := el.Run(ctx, func(ctx context.Context) {
//		_ = processor.Run(ctx) // claims only while this replica leads
//	})
//
// Leadership is exclusive as far as PostgreSQL can tell; once the server
// has ended the leader's session (a restart, a termination, a network
// split it noticed), the old leader stops within CheckInterval, or within
// its check's timeout when the server does not answer, so for that long two
// replicas may claim at once. That is safe: the claim keeps FIFO per group
// with any number of processors; single-active mode is for users who want
// one active processor, not a correctness requirement.
type Elector struct {
	s      *Store
	opts   ElectorOptions
	nsKey  int32
	key    int32
	leader atomic.Bool
}

// Elector returns an Elector for this store's outbox.
func (s *Store) Elector(opts ElectorOptions) *Elector {
	elect.Default(&opts.Name, &opts.RetryInterval, &opts.CheckInterval)
	h := fnv.New32a()
	_, _ = h.Write([]byte(opts.Name))
	return &Elector{s: s, opts: opts, nsKey: ns(s.messages + ":leader"), key: int32(h.Sum32())} //nolint:gosec // a hash
}

// IsLeader reports whether this Elector holds the leadership now.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Run campaigns until ctx ends. Each time this replica becomes leader it
// calls lead with a context that is cancelled when leadership ends (ctx
// ended or the lock's connection failed), waits for lead to return, and
// releases the lock; if lead returns on its own, Run releases the lock and
// campaigns again. A nil lead just holds the leadership while it lasts, for
// use with outbox.Config.Leader:
//
//	el := store.Elector(postgres.ElectorOptions{})
//	go el.Run(ctx, nil)
//	p, err := outbox.NewProcessor(store, router, outbox.Config{Leader: el})
//
// Run returns nil when ctx ends, or an error when the store cannot open a
// dedicated connection at all.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	if lead == nil {
		lead = func(ctx context.Context) { <-ctx.Done() }
	}
	for ctx.Err() == nil {
		conn, err := e.s.dedicated(ctx)
		if errors.Is(err, errNoDedicated) {
			return err
		}
		if err != nil {
			if ctx.Err() == nil {
				e.s.log.WarnContext(ctx, "outboxkit/postgres: elector cannot connect", "err", err)
			}
			if !sleepCtx(ctx, e.opts.RetryInterval) {
				return nil
			}
			continue
		}
		led := e.campaign(ctx, conn, lead)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		if led {
			e.awaitReleased(context.WithoutCancel(ctx))
		}
		if ctx.Err() == nil && !sleepCtx(ctx, e.opts.RetryInterval) {
			return nil
		}
	}
	return nil
}

// awaitReleased waits, for at most releaseWait, until the server no longer
// holds the election's lock for the session just closed: a session's
// locks go when its backend exits, which a closed connection only starts
// (a context's end cuts the lock's connection off mid-read, so the lock
// cannot always be released by pg_advisory_unlock). Run returns once the
// election is free to take.
func (e *Elector) awaitReleased(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, releaseWait)
	defer cancel()
	for {
		var held bool
		err := e.s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = ($1::int4)::oid AND objid = ($2::int4)::oid AND objsubid = 2)`, e.nsKey, e.key).Scan(&held)
		if err != nil || !held || !sleepCtx(ctx, 10*time.Millisecond) {
			return
		}
	}
}

// releaseWait bounds how long Run waits for the server to drop the lock of
// a session it closed.
const releaseWait = 2 * time.Second

// campaign uses conn until it fails or ctx ends; it reports whether it led.
func (e *Elector) campaign(ctx context.Context, conn *pgx.Conn, lead func(ctx context.Context)) (led bool) {
	for ctx.Err() == nil {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int4, $2::int4)`, e.nsKey, e.key).Scan(&got); err != nil {
			if ctx.Err() == nil {
				e.s.log.WarnContext(ctx, "outboxkit/postgres: elector lost its connection", "err", err)
			}
			return led
		}
		if !got {
			if !sleepCtx(ctx, e.opts.RetryInterval) {
				return led
			}
			continue
		}
		led = true
		healthy := e.lead(ctx, conn, lead)
		if !healthy {
			return led
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1::int4, $2::int4)`, e.nsKey, e.key)
		cancel()
		if err != nil {
			return led
		}
	}
	return led
}

// lead runs the leader's term; it reports whether conn is still healthy.
func (e *Elector) lead(ctx context.Context, conn *pgx.Conn, lead func(ctx context.Context)) bool {
	e.leader.Store(true)
	e.s.log.InfoContext(ctx, "outboxkit/postgres: became leader", "election", e.opts.Name)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(lctx)
	}()
	// Watch the lock's connection: a blocked read returns at once when the
	// server ends the session (restart, termination), and a ping every
	// CheckInterval catches a silent network loss.
	watchCtx, stopWatch := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
		case <-watchCtx.Done():
		}
		stopWatch()
	}()
	healthy := true
	for watchCtx.Err() == nil {
		wctx, wcancel := context.WithTimeout(watchCtx, e.opts.CheckInterval)
		_, err := conn.WaitForNotification(wctx)
		wcancel()
		if watchCtx.Err() != nil {
			break
		}
		if err != nil && (errors.Is(err, context.DeadlineExceeded) || pgconnTimeout(err)) {
			pctx, pcancel := context.WithTimeout(watchCtx, max(e.opts.CheckInterval, elect.MinCheckTimeout))
			err = conn.Ping(pctx)
			pcancel()
			if err != nil && watchCtx.Err() != nil {
				break
			}
		}
		if err != nil {
			e.s.log.WarnContext(ctx, "outboxkit/postgres: leader lost its lock's connection, stepping down", "err", err)
			healthy = false
			break
		}
	}
	stopWatch()
	e.leader.Store(false)
	cancel()
	<-done
	e.s.log.InfoContext(context.WithoutCancel(ctx), "outboxkit/postgres: stepped down", "election", e.opts.Name)
	return healthy && ctx.Err() == nil
}
