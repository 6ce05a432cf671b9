package postgres

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestStorageStats: the dead row versions a drain leaves in the messages
// table show up in the report, and a transaction left open (the usual
// reason vacuum cannot remove them) is named as the cleanup horizon, its
// age growing with every transaction after it.
func TestStorageStats(t *testing.T) {
	s, pg, ctx := migratedStore(t, Options{})
	st, err := s.StorageStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range st.Tables {
		names = append(names, tb.Name)
	}
	want := []string{s.attempts, s.inboxTable(), s.messages, s.pauses}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("tables %v, want %v", names, want)
	}

	// 500 rows, each updated twice (dead versions), on one connection
	// whose statistics are then reported at once.
	conn, err := pg.Pool.Acquire(ctx) // of the pool's 2
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			conn.Release()
		}
	}()
	const n = 500
	if _, err := conn.Exec(ctx, `INSERT INTO `+s.messages+` (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, 'default', 't', 'g' || (i % 10), 'm' || i, 'PENDING', now(), now(), now(), '{}'::json
FROM generate_series(1, $1::int) AS i`, n); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{`status = 'PROCESSING', claimed_by = 'p', claimed_at = now()`, `status = 'SENT', claimed_by = NULL, sent_at = now()`} {
		if _, err := conn.Exec(ctx, `UPDATE `+s.messages+` SET `+set); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	released = true
	deadline := time.Now().Add(15 * time.Second)
	var msgs outbox.TableStorage
	for {
		st, err = s.StorageStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range st.Tables {
			if tb.Name == s.messages {
				msgs = tb
			}
		}
		if msgs.DeadRows >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if msgs.DeadRows < n || msgs.LiveRows != n {
		t.Fatalf("messages table %+v, want %d live rows and at least %d dead ones", msgs, n, n)
	}

	// A session that holds its snapshot while 5 transactions run after it.
	holder, err := pg.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	var pid int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := pg.Pool.Exec(ctx, `SELECT txid_current()`); err != nil {
			t.Fatal(err)
		}
	}
	st, err = s.StorageStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Other tests' sessions may hold an older one: ours is at least 5 old.
	if st.Horizon.AgeTransactions < 5 || st.Horizon.Holder == "" {
		t.Fatalf("horizon %+v with a transaction open for 5 others, want an age of 5 or more and its holder", st.Horizon)
	}
	if strings.Contains(st.Horizon.Holder, "session "+strconv.Itoa(pid)+" ") && !strings.Contains(st.Horizon.Holder, "idle in transaction") {
		t.Fatalf("horizon %+v: the holding session is idle in a transaction", st.Horizon)
	}
	t.Logf("horizon: %d transactions, %s", st.Horizon.AgeTransactions, st.Horizon.Holder)
	held := st.Horizon.AgeTransactions
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The horizon held by our session is gone: whatever is left is younger
	// or held by another test's session.
	st, err = s.StorageStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(st.Horizon.Holder, "session "+strconv.Itoa(pid)+" ") {
		t.Fatalf("horizon %+v still names the session after its commit (was %d)", st.Horizon, held)
	}
}

// TestStorageStatsHonoursContext: an ended context fails the report.
func TestStorageStatsHonoursContext(t *testing.T) {
	s, _, ctx := migratedStore(t, Options{})
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.StorageStats(ctx); err == nil {
		t.Fatal("StorageStats with an ended context: no error")
	}
}
