package postgres

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestPendingTopicsSkipsExcludedBacklog: the processor's check for topics
// nobody claims leaves out the topics it claims without reading their
// messages, so a backlog of a claimed topic (or any history) does not make
// it a scan of the table. It compares the buffers the statement reads with
// and without the exclusion (counts, not times).
func TestPendingTopicsSkipsExcludedBacklog(t *testing.T) {
	t.Parallel()
	s, pg, ctx := oneConnStore(t, Options{})
	past := time.Now().Add(-time.Hour)
	// A backlog of the claimed topic over 1,000 groups and two tenants,
	// and three messages of a topic nobody claims: two ordered ones in two
	// tenants, one unordered.
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, 't' || (i %% 2), 'claimed', 'g' || (i %% 1000), 'm' || i, 'PENDING', $1, $1, $1, '{"n":1}'::json
FROM generate_series(1, 20000) AS i`, s.MessagesTable()), past); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.MessagesTable()+` (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
VALUES ('l1', 't0', 'lost', 'g', 'l1', 'PENDING', $1, $1, $1, '{}'), ('l2', 't1', 'lost', 'g', 'l2', 'PENDING', $2, $1, $1, '{}'),
	('l3', 't1', 'lost', '', 'l3', 'PENDING', $1, $1, $1, '{}')`, past, past.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	got, err := s.MessagePendingTopics(ctx, outbox.MessagePendingTopicsParams{DueBefore: time.Now(), ExcludeTopics: []string{"claimed"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Topic != "lost" || got[0].Messages != 3 || !got[0].OldestDueAt.Equal(past.Truncate(time.Microsecond)) {
		t.Fatalf("pending topics = %+v, want lost: 3 messages, oldest due %v", got, past)
	}
	all, err := s.MessagePendingTopics(ctx, outbox.MessagePendingTopicsParams{DueBefore: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Topic != "claimed" || all[0].Messages != 20000 || all[1].Topic != "lost" || all[1].Messages != 3 {
		t.Fatalf("pending topics without exclusion = %+v, want claimed: 20000, lost: 3", all)
	}

	buffers := func(exclude []string) int {
		t.Helper()
		plan := explainIn(t, ctx, pg.Pool, planSettings, "(ANALYZE, BUFFERS) "+s.sql.pendingTopics, time.Now(), exclude)
		m := regexp.MustCompile(`Buffers: shared hit=(\d+)`).FindStringSubmatch(plan)
		if m == nil {
			t.Fatalf("no buffer counts in the plan:\n%s", plan)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	excluded, counted := buffers([]string{"claimed"}), buffers([]string{})
	t.Logf("shared buffers read: %d excluding the claimed topic, %d counting it", excluded, counted)
	// Counting the backlog reads every message (20,000 heap visits);
	// leaving it out reads a few index pages per tenant and topic.
	if excluded*20 > counted {
		t.Fatalf("excluding the claimed topic read %d buffers, counting it %d: the backlog was read", excluded, counted)
	}
}
