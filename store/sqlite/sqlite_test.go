package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// newStore opens a migrated store on a fresh file in t's temp dir.
func newStore(t *testing.T, opts sqlite.Options) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return st
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		NewBackend: func(t *testing.T) storetest.Backend[*sql.Tx] {
			st := newStore(t, sqlite.Options{})
			return storetest.SQLBackend(st)
		},
		Features: storetest.Features{ConcurrentWriters: false, ProcessorMessages: processorMessages()},
	})
}

// processorMessages is the size of the processor-tier FIFO test: the full
// 10,000 messages (about 4 s on an idle machine), 2,000 under the race
// detector (which slows the pure-Go SQLite engine about a hundredfold),
// 1,000 with -short.
func processorMessages() int {
	switch {
	case testing.Short():
		return 1_000
	case raceEnabled:
		return 2_000
	}
	return 10_000
}
