package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// TestLogProtoLateCommit: the design's window starts at the first message
// a claim saw unfinished, less a margin, so a message whose transaction drew
// its seq early and committed after the claims had moved on is behind the
// window. The backstop (one probe per known group) still finds it, and its
// group's registry row commits with it.
func TestLogProtoLateCommit(t *testing.T) {
	ctx := context.Background()
	s := lpSetup(t)
	late, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	var lateSeq int64
	if err := late.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %[1]s.log (id, tenant, topic, grp, payload) VALUES ('late', '', 'bench', 'late', '{}') RETURNING seq;
		`, s.schema)).Scan(&lateSeq); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.groups VALUES ('', 'bench', 'late') ON CONFLICT DO NOTHING`, s.schema)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i += 100 {
		msgs := make([]outbox.Message, 100)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench", Group: groupNames[(i+j)%50], Payload: []byte(`{}`)}
		}
		if err := s.enqueue(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	cl := &lpClaimer{s: s, window: 3000, perGrp: 100, limit: 500, margin: 1000}
	drain := func() map[string]bool {
		got := map[string]bool{}
		for {
			msgs, runs, token, err := cl.claim(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 0 {
				return got
			}
			for _, m := range msgs {
				if got[m.ID] {
					t.Fatalf("message %s claimed twice", m.ID)
				}
				got[m.ID] = true
			}
			if _, err := s.finish(ctx, runs, token); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(drain()); n != 3000 {
		t.Fatalf("claimed %d of the 3,000 committed messages", n)
	}
	if cl.floor <= lateSeq+int64(cl.margin) {
		t.Fatalf("the floor is %d: the window still covers the late message (seq %d), the test proves nothing", cl.floor, lateSeq)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cl.nextRescan = time.Now().Add(time.Hour)
	if got := drain(); len(got) != 0 {
		t.Fatalf("the window claimed %v: it should be past the late message", got)
	}
	cl.nextRescan = time.Time{}
	if got := drain(); !got["late"] || len(got) != 1 {
		t.Fatalf("the backstop claimed %v, want the late message only", got)
	}
}

// TestLogProtoLeaseDoesNotHoldTheFloor: a group leased for long (a slow
// publisher) must not hold the log window back, or every message more than
// a window behind it would wait; and once its run is done, the rest of the
// group, now far behind the window, is found through the done mark, not
// by the backstop.
func TestLogProtoLeaseDoesNotHoldTheFloor(t *testing.T) {
	ctx := context.Background()
	slow := outbox.Message{Topic: "bench", Group: "slow", Payload: []byte(`{}`)}
	s := lpSetup(t, slow, slow)
	for i := 0; i < 3000; i += 100 { // 30 groups of 100 in a row: the window of 1,000 sees 10 at a time
		msgs := make([]outbox.Message, 100)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench", Group: groupNames[i/100], Payload: []byte(`{}`)}
		}
		if err := s.enqueue(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	a := &lpClaimer{s: s, window: 1000, perGrp: 1, limit: 1, margin: 100}
	held, heldRuns, heldToken, err := a.claim(ctx)
	if err != nil || len(held) != 1 || held[0].Group != "slow" {
		t.Fatalf("the slow claimer took %v, %v; want the slow group's first message", held, err)
	}
	b := &lpClaimer{s: s, window: 1000, perGrp: 100, limit: 500, margin: 100, nextRescan: time.Now().Add(time.Hour)}
	drain := func() map[string]bool {
		got := map[string]bool{}
		for {
			msgs, runs, token, err := b.claim(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 0 {
				return got
			}
			for _, m := range msgs {
				got[m.Group+"/"+m.ID] = true
			}
			if _, err := s.finish(ctx, runs, token); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(drain()); n != 3000 {
		t.Fatalf("with one group leased, the other claimer took %d of the 3,000 other messages", n)
	}
	if _, err := s.finish(ctx, heldRuns, heldToken); err != nil {
		t.Fatal(err)
	}
	got := drain()
	if len(got) != 1 || !got["slow/"+rest(t, s, "slow")] {
		t.Fatalf("after the slow run was done the other claimer took %v, want the slow group's second message", got)
	}
}

// rest returns the ID of group's last message.
func rest(t *testing.T, s *lpStore, group string) string {
	t.Helper()
	var id string
	if err := s.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT id FROM %s.log WHERE grp = $1 ORDER BY seq DESC LIMIT 1`, s.schema), group).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// lpSetup returns a fresh prototype schema with msgs enqueued.
func lpSetup(t *testing.T, msgs ...outbox.Message) *lpStore {
	t.Helper()
	ctx := context.Background()
	pool, err := newPool(ctx, testbackend.PostgresDSN(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, cleanup, err := newLogProto(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	if len(msgs) > 0 {
		if err := s.enqueue(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// claimUntil claims with c until a claim returns messages or 30 s pass.
func claimUntil(t *testing.T, c *lpClaimer) ([]outbox.Message, []lpRun, int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		msgs, runs, token, err := c.claim(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) > 0 {
			return msgs, runs, token
		}
	}
	t.Fatal("nothing was claimed in 30 s")
	return nil, nil, 0
}

func seqs(ms []outbox.Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Seq
	}
	return out
}

// TestLogProtoRetryHoldsItsGroup: a run whose second message failed marks
// the first done and the second waiting; nothing of the group is claimed
// until the wait ends, and then the rest of the run, in order, through the
// retry's due time (the window has moved on, the backstop is off and the
// lease outlasts the test).
func TestLogProtoRetryHoldsItsGroup(t *testing.T) {
	m := func(g string) outbox.Message { return outbox.Message{Topic: "bench", Group: g, Payload: []byte(`{}`)} }
	s := lpSetup(t, m("g"), m("g"), m("g"), m("h"))
	ctx := context.Background()
	c := &lpClaimer{s: s, window: 100, perGrp: 100, limit: 100, lease: time.Hour, nextRescan: time.Now().Add(time.Hour)}
	msgs, _, token, err := c.claim(ctx)
	if err != nil || len(msgs) != 4 {
		t.Fatalf("claimed %v, %v; want all 4", msgs, err)
	}
	at := time.Now().Add(1500 * time.Millisecond)
	runs := []lpRun{{tenant: "", topic: "bench", grp: "g", upto: msgs[0].Seq, retryAt: &at}, {tenant: "", topic: "bench", grp: "h", upto: msgs[3].Seq}}
	if n, err := s.finish(ctx, runs, token); err != nil || n != 2 {
		t.Fatalf("finish applied %d, %v; want 2", n, err)
	}
	if got, _, _, err := c.claim(ctx); err != nil || len(got) != 0 {
		t.Fatalf("before the retry was due, claimed %v, %v", seqs(got), err)
	}
	got, _, _ := claimUntil(t, c)
	if time.Now().Before(at) {
		t.Fatalf("claimed %v before the retry was due", seqs(got))
	}
	if len(got) != 2 || got[0].Seq != msgs[1].Seq || got[1].Seq != msgs[2].Seq {
		t.Fatalf("after the retry came due, claimed %v; want %v", seqs(got), seqs(msgs[1:3]))
	}
}

// TestLogProtoExpiredLeaseIsTakenOverAndFenced: a run whose lease expired
// (its processor stalled) is claimed again from its start by another
// claimer, found through the lease's expiry time; the stalled claimer's
// late outcome is refused by the claim token, and the new one's applies.
func TestLogProtoExpiredLeaseIsTakenOverAndFenced(t *testing.T) {
	m := outbox.Message{Topic: "bench", Group: "g", Payload: []byte(`{}`)}
	s := lpSetup(t, m, m)
	ctx := context.Background()
	a := &lpClaimer{s: s, window: 100, perGrp: 100, limit: 100, lease: time.Second}
	first, firstRuns, firstToken, err := a.claim(ctx)
	if err != nil || len(first) != 2 {
		t.Fatalf("claimed %v, %v; want both", first, err)
	}
	b := &lpClaimer{s: s, window: 100, perGrp: 100, limit: 100, lease: time.Second, nextRescan: time.Now().Add(time.Hour)}
	if got, _, _, err := b.claim(ctx); err != nil || len(got) != 0 {
		t.Fatalf("while the lease was live, claimed %v, %v", seqs(got), err)
	}
	again, runs, token := claimUntil(t, b)
	if len(again) != 2 || again[0].Seq != first[0].Seq || again[1].Seq != first[1].Seq {
		t.Fatalf("after the lease expired, claimed %v; want %v", seqs(again), seqs(first))
	}
	if n, err := s.finish(ctx, firstRuns, firstToken); err != nil || n != 0 {
		t.Fatalf("the stalled claim's late outcome applied to %d groups, %v; want 0", n, err)
	}
	if n, err := s.finish(ctx, runs, token); err != nil || n != 1 {
		t.Fatalf("the new claim's outcome applied to %d groups, %v; want 1", n, err)
	}
	if got, _, _, err := b.claim(ctx); err != nil || len(got) != 0 {
		t.Fatalf("after the run was done, claimed %v, %v", seqs(got), err)
	}
}

// TestLogProtoUnordered: unordered messages are groups of one: two
// claimers take all of them once each, a retry of one holds nothing else,
// and it comes back when due.
func TestLogProtoUnordered(t *testing.T) {
	msgs := make([]outbox.Message, 300)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "bench", Payload: []byte(`{}`)}
	}
	s := lpSetup(t, msgs...)
	ctx := context.Background()
	newClaimer := func() *lpClaimer {
		return &lpClaimer{s: s, window: 1000, perGrp: 100, limit: 100, lease: time.Hour, nextRescan: time.Now().Add(time.Hour)}
	}
	claimers := []*lpClaimer{newClaimer(), newClaimer()}
	seen := map[string]bool{}
	var retried outbox.Message
	var at time.Time
	for i := 0; ; i++ {
		got, runs, token, err := claimers[i%2].claim(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		for _, m := range got {
			if seen[m.ID] {
				t.Fatalf("message %d claimed twice", m.Seq)
			}
			seen[m.ID] = true
		}
		if len(runs) != len(got) {
			t.Fatalf("%d messages in %d runs: an unordered message is a run of its own", len(got), len(runs))
		}
		if retried.ID == "" {
			retried, at = got[0], time.Now().Add(1500*time.Millisecond)
			runs[0].upto, runs[0].retryAt = retried.Seq-1, &at
		}
		if n, err := s.finish(ctx, runs, token); err != nil || n != len(runs) {
			t.Fatalf("finish applied %d of %d, %v", n, len(runs), err)
		}
	}
	if len(seen) != len(msgs) {
		t.Fatalf("claimed %d of %d before the retry was due", len(seen), len(msgs))
	}
	got, _, _ := claimUntil(t, claimers[0])
	if time.Now().Before(at) || len(got) != 1 || got[0].ID != retried.ID {
		t.Fatalf("claimed %v; want the retried message %d once it was due", seqs(got), retried.Seq)
	}
}

// TestLogProtoExplainTakesNothing: with -lp-explain, each claim first
// explains its two statements in a transaction it rolls back, reading the
// candidates as the claim does; the claim after it still leases the whole
// run.
func TestLogProtoExplainTakesNothing(t *testing.T) {
	m := outbox.Message{Topic: "bench", Group: "g", Payload: []byte(`{}`)}
	s := lpSetup(t, m, m, m)
	c := &lpClaimer{s: s, window: 100, perGrp: 100, limit: 100, margin: 100, explainEvery: time.Nanosecond}
	msgs, runs, _ := claimUntil(t, c)
	if len(msgs) != 3 || len(runs) != 1 {
		t.Fatalf("claim after explain: %d messages in %d runs, want 3 in 1", len(msgs), len(runs))
	}
}
