package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// benchContinuous inserts and works at once: 4 producers enqueue 100
// messages per transaction (over the drain's groups) whenever the backlog
// (enqueued, not yet published) is below backlog, while procs processors
// work, for c.contFor after a warm-up of a fifth of it. Each producer
// writes its own quarter of the groups (as partitioned producers do), so
// producers never wait for each other's group locks; with
// -cont-shared-groups they draw from all groups and serialise wherever
// their transactions share a group (a group's commit order is its
// publication order). The figure is
// worked (published) messages per second over that window; the note gives
// the backlog's range, FIFO, duplicates and PostgreSQL CPU per worked
// message. The table starts with backlog messages, analysed.
func benchContinuous(ctx context.Context, c config, pool *pgxpool.Pool, procs, backlog int) (float64, string, error) {
	s, cleanup, err := fresh(ctx, pool, postgres.Options{})
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	if err := bulkEnqueue(ctx, s, backlog, c.drainGroups); err != nil {
		return 0, "", err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+s.MessagesTable()); err != nil {
		return 0, "", err
	}
	if c.hold {
		release, err := holdHorizon(ctx, c.dsn)
		if err != nil {
			return 0, "", err
		}
		defer release()
	}
	var enqueued atomic.Int64
	enqueued.Store(int64(backlog))
	pub := newFIFO()
	stop := runProcessors(ctx, c.dsn, s, pub, procs, outbox.Config{PollBatchSize: c.claimBatch, BufferSize: 2 * c.claimBatch, MaxConcurrentGroups: 10, PollInterval: 100 * time.Millisecond})
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	stopProducers := produce(ctx, backlog, &pub.n, &enqueued, func(w int, rng *mrand.Rand) string {
		n := rng.IntN(c.drainGroups)
		if !sharedGroups {
			n = w + 4*rng.IntN(c.drainGroups/4)
		}
		return groupNames[n]
	}, func(ctx context.Context, msgs []outbox.Message) error {
		_, err := ob.Enqueue(ctx, msgs...)
		return err
	})
	win, err := measureWindow(ctx, c, pool, s.Schema(), &pub.n, &enqueued)
	if err != nil {
		return 0, "", err
	}
	if err := errors.Join(stopProducers(), stop()); err != nil {
		return 0, "", err
	}
	note := fmt.Sprintf("enqueued %.0f msg/s, backlog %d-%d", win.enqueueRate(), win.lo, win.hi)
	if sharedGroups {
		note += ", producers share groups"
	}
	return win.rate(), note + pub.fifoNote() + win.note(false), nil
}

// fifoNote says whether every group was published in order, and how many
// messages were published twice.
func (f *fifoPublisher) fifoNote() string {
	note := ", FIFO held: yes"
	if v := f.violated.Load(); v > 0 {
		note = fmt.Sprintf(", FIFO held: NO (%d out of order)", v)
	}
	return note + fmt.Sprintf(", duplicates: %d", f.dup.Load())
}

// produce runs the continuous runs' 4 producers until stop: each enqueues
// 100 messages per transaction, in groups group draws (w is the producer),
// whenever the backlog (enqueued, not yet published) is below backlog.
// stop returns the first error.
func produce(ctx context.Context, backlog int, published, enqueued *atomic.Int64, group func(w int, rng *mrand.Rand) string,
	enqueue func(context.Context, []outbox.Message) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), 2))
			msgs := make([]outbox.Message, 100)
			for i := 0; ctx.Err() == nil; i++ {
				if enqueued.Load()-published.Load() >= int64(backlog) {
					time.Sleep(time.Millisecond)
					continue
				}
				for j := range msgs {
					g := group(w, rng)
					msgs[j] = outbox.Message{Topic: "bench", Group: g, Payload: payload(g, i)}
				}
				if err := enqueue(ctx, msgs); err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("enqueue: %w", err)
					}
					return
				}
				enqueued.Add(int64(len(msgs)))
			}
		}()
	}
	return func() error {
		cancel()
		wg.Wait()
		close(errs)
		return <-errs
	}
}

// window is what a continuous run did over its measured window.
type window struct {
	worked, enqueued int64
	elapsed          time.Duration
	lo, hi           int64 // the backlog's range, sampled every 100 ms
	cpu              time.Duration
	local            bool // cpu was read (the server is on this machine)
	w0, w1           tableWork
}

// measureWindow waits out a warm-up of a fifth of c.contFor, then measures
// c.contFor: the messages published and enqueued (the counters), the
// backlog between them, PostgreSQL's CPU and the statistics of schema's
// tables (per table and index with -work-detail).
func measureWindow(ctx context.Context, c config, pool *pgxpool.Pool, schema string, published, enqueued *atomic.Int64) (window, error) {
	time.Sleep(c.contFor / 5)
	n0, e0 := published.Load(), enqueued.Load()
	cpu0, local := pgCPU(c.dsn)
	w0, err := schemaWork(ctx, pool, schema)
	if err != nil {
		return window{}, err
	}
	rel0, err := relationWork(ctx, pool, schema)
	if err != nil {
		return window{}, err
	}
	start := time.Now()
	lo, hi := int64(-1), int64(0)
	for time.Since(start) < c.contFor {
		time.Sleep(100 * time.Millisecond)
		b := enqueued.Load() - published.Load()
		if lo < 0 || b < lo {
			lo = b
		}
		hi = max(hi, b)
	}
	elapsed := time.Since(start)
	n1, e1 := published.Load(), enqueued.Load()
	cpu1, _ := pgCPU(c.dsn)
	w1, err := schemaWork(ctx, pool, schema)
	if err != nil {
		return window{}, err
	}
	if workDetail && n1 > n0 {
		if err := printRelationWork(ctx, pool, schema, rel0, int(n1-n0)); err != nil {
			return window{}, err
		}
	}
	return window{worked: n1 - n0, enqueued: e1 - e0, elapsed: elapsed, lo: lo, hi: hi, cpu: cpu1 - cpu0, local: local, w0: w0, w1: w1}, nil
}

func (w window) rate() float64        { return float64(w.worked) / w.elapsed.Seconds() }
func (w window) enqueueRate() float64 { return float64(w.enqueued) / w.elapsed.Seconds() }

// note gives the dead row versions per published message (every update and
// delete leaves one, which a held cleanup horizon keeps; the statistics lag
// by about a second, equally at both ends of the window), with work the
// buffer accesses and row writes, and PostgreSQL's CPU per message.
func (w window) note(work bool) string {
	var note string
	if w.worked > 0 {
		note += fmt.Sprintf(", dead row versions %.2f/msg", float64(w.w1.updates+w.w1.deletes-w.w0.updates-w.w0.deletes)/float64(w.worked))
		if work {
			note += ", " + w.w1.perMessage(w.w0, int(w.worked))
		}
	}
	if w.local && w.worked > 0 {
		note += fmt.Sprintf(", PostgreSQL CPU %.0f µs/msg", float64(w.cpu.Microseconds())/float64(w.worked))
	}
	return note
}

// holdHorizon opens a session of its own that holds PostgreSQL's cleanup
// horizon, as a long report query, a forgotten BEGIN in psql or pg_dump
// does: a transaction with a transaction ID, left open until release.
// Nothing written after it began can be vacuumed away while it is open.
func holdHorizon(ctx context.Context, dsn string) (release func(), err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT txid_current()")
	}
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("hold the cleanup horizon: %w", err)
	}
	return func() {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		_ = conn.Close(context.WithoutCancel(ctx))
	}, nil
}
