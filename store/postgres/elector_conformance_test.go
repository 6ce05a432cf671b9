package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestElectorConformance runs the election cases of the conformance suite
// against the advisory-lock Elector, each on a fresh schema.
func TestElectorConformance(t *testing.T) {
	t.Parallel()
	storetest.RunElector(t, storetest.ElectorHarness{NewElection: func(t *testing.T) storetest.Election {
		s, pg := newStore(t, false)
		opts := postgres.ElectorOptions{RetryInterval: 100 * time.Millisecond, CheckInterval: 100 * time.Millisecond}
		ns, key := postgres.ElectorLockKeys(s.Elector(opts))
		// The sessions holding the election's lock (pg_locks shows the
		// two int4 keys as oids).
		const holders = `SELECT pid FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = $1::int8::oid AND objid = $2::int8::oid`
		args := []any{int64(uint32(ns)), int64(uint32(key))}
		return storetest.Election{
			New: func(*testing.T) storetest.Elector { return s.Elector(opts) },
			Held: func(ctx context.Context) (bool, error) {
				var held bool
				err := pg.Pool.QueryRow(ctx, `SELECT EXISTS (`+holders+`)`, args...).Scan(&held)
				return held, err
			},
			Sever: func(ctx context.Context, _ storetest.Elector) error {
				var killed int
				if err := pg.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM (`+holders+`) h`, args...).Scan(&killed); err != nil {
					return err
				}
				if killed != 1 {
					return fmt.Errorf("terminated %d sessions holding the lock, want 1", killed)
				}
				return nil
			},
			Bound: opts.RetryInterval + opts.CheckInterval,
		}
	}})
}
