package postgres

import (
	"strings"
	"testing"
	"time"
)

// TestLogScansPlans: on append-only storage, the backstop and the pending
// topics read indexes, never the whole messages table, however many
// finished messages the table keeps (their rows stay PENDING): the log's
// end comes from the log window's index, and unordered messages from an
// index of their own.
func TestLogScansPlans(t *testing.T) {
	s, pg, ctx := planTable(t, Options{AppendOnly: true}, "'m' || i")
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.groupsTable()+` SELECT DISTINCT tenant, topic, grp FROM `+s.messages); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, "ANALYZE "+s.groupsTable()); err != nil {
		t.Fatal(err)
	}
	seqScan := "Seq Scan on " + s.prefix + "messages"
	backstop := explainIn(t, ctx, pg.Pool, logSettings, s.lsql.logBackstop, int64(0))
	if strings.Contains(backstop, seqScan) || !strings.Contains(backstop, s.prefix+"messages_unordered_seq") ||
		!strings.Contains(backstop, s.prefix+"messages_pending_seq") {
		t.Errorf("the backstop scans the messages table, or not through its indexes:\n%s", backstop)
	}
	pending := explainIn(t, ctx, pg.Pool, logSettings, s.reads().pendingTopics, time.Now(), []string{"routed"})
	if strings.Contains(pending, seqScan) || !strings.Contains(pending, s.prefix+"messages_unordered_seq") {
		t.Errorf("the pending topics scan the messages table, or not through the unordered index:\n%s", pending)
	}
}
