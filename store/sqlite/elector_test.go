package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// TestElectorConformance runs the election cases of the conformance suite
// against the in-process Elector, each on a fresh file. Every elector has
// a Store of its own on the file, so that Sever can close one leader's
// database; the election is still one, by the file's path.
func TestElectorConformance(t *testing.T) {
	t.Parallel()
	storetest.RunElector(t, storetest.ElectorHarness{NewElection: func(t *testing.T) storetest.Election {
		path := filepath.Join(t.TempDir(), "outbox.db")
		// Another path to the same file: the election follows the link.
		link := filepath.Join(t.TempDir(), "link.db")
		opts := sqlite.ElectorOptions{RetryInterval: 100 * time.Millisecond, CheckInterval: 100 * time.Millisecond}
		var (
			mu     sync.Mutex
			stores = map[storetest.Elector]*sqlite.Store{}
			opened int
		)
		open := func(t *testing.T) *sqlite.Store {
			mu.Lock()
			p := path
			if opened++; opened%2 == 0 {
				p = link
			}
			mu.Unlock()
			s, err := sqlite.Open(context.Background(), p, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		probe := open(t).Elector(opts)
		if err := os.Symlink(path, link); err != nil {
			t.Fatal(err)
		}
		return storetest.Election{
			New: func(t *testing.T) storetest.Elector {
				s := open(t)
				e := s.Elector(opts)
				mu.Lock()
				stores[e] = s
				mu.Unlock()
				return e
			},
			Held: func(ctx context.Context) (bool, error) { return sqlite.ElectorHeld(ctx, probe) },
			Sever: func(_ context.Context, leader storetest.Elector) error {
				mu.Lock()
				s := stores[leader]
				mu.Unlock()
				return s.Close()
			},
			Bound: opts.RetryInterval + opts.CheckInterval,
		}
	}})
}
