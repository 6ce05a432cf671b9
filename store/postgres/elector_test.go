package postgres_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestElectorOneLeaderAndFailover: of three electors exactly one leads;
// when the leader's connection dies, another takes over.
func TestElectorOneLeaderAndFailover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	opts := postgres.ElectorOptions{RetryInterval: 50 * time.Millisecond, CheckInterval: 50 * time.Millisecond}
	var (
		leading atomic.Int32
		maxSeen atomic.Int32
		terms   atomic.Int32
		wg      sync.WaitGroup
	)
	els := make([]*postgres.Elector, 3)
	for i := range els {
		els[i] = b.store.Elector(opts)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := els[i].Run(ctx, func(ctx context.Context) {
				n := leading.Add(1)
				for {
					if m := maxSeen.Load(); n <= m || maxSeen.CompareAndSwap(m, n) {
						break
					}
				}
				terms.Add(1)
				<-ctx.Done()
				leading.Add(-1)
			})
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	leaders := func() int {
		n := 0
		for _, e := range els {
			if e.IsLeader() {
				n++
			}
		}
		return n
	}
	waitFor("a leader", func() bool { return leaders() == 1 })
	time.Sleep(300 * time.Millisecond)
	if n := leaders(); n != 1 {
		t.Fatalf("%d leaders", n)
	}
	if m := maxSeen.Load(); m != 1 {
		t.Fatalf("%d leaders at once before any failure", m)
	}
	// Kill the leader's lock connection from the server side.
	var killed int
	if err := b.pg.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid()
		AND a.state = 'idle' AND l.objsubid = 2`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("killed %d: %v", killed, err)
	}
	waitFor("a second term", func() bool { return terms.Load() >= 2 && leaders() == 1 })
	// While the old leader notices its dead connection (within
	// CheckInterval, as the Elector's doc says) two terms may overlap; once
	// it has, exactly one replica leads again.
	time.Sleep(4 * opts.CheckInterval)
	maxSeen.Store(leading.Load())
	time.Sleep(300 * time.Millisecond)
	if n := leaders(); n != 1 {
		t.Fatalf("%d leaders after the failover settled", n)
	}
	cancel()
	wg.Wait()
	if m := maxSeen.Load(); m != 1 {
		t.Fatalf("%d leaders at once after the failover settled", m)
	}
	if leaders() != 0 {
		t.Fatal("a leader after ctx ended")
	}
}
