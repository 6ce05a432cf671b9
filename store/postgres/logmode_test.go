package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// newLogStore is a migrated store on the append-only path, and its schema.
func newLogStore(t *testing.T) (*postgres.Store, *outbox.Outbox[pgx.Tx], testbackend.PostgresSchema) {
	t.Helper()
	s, pg := newStore(t, false)
	postgres.EnableLogMode(s)
	return s, outbox.New[pgx.Tx](s, outbox.Options{}), pg
}

// A claim takes at most its limit, however many groups its windows hold
// and however long their runs: runs are cut to a prefix, oldest first.
func TestLogModeClaimKeepsItsLimit(t *testing.T) {
	t.Parallel()
	s, ob, _ := newLogStore(t)
	ctx := context.Background()
	var msgs []outbox.Message
	// 50 messages in each of 200 groups: the log window counts 15 of
	// each, its runs are longer.
	for i := range 10000 {
		msgs = append(msgs, msg("t", fmt.Sprintf("g%d", i%200), i))
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	next := map[string]int{} // per group, the next n expected
	total := 0
	for claim := 0; total < len(msgs); claim++ {
		if claim > 200 {
			t.Fatalf("claimed %d of %d after 200 claims", total, len(msgs))
		}
		got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 150, Owner: "p", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 150 {
			t.Fatalf("claim %d took %d messages, limit 150", claim, len(got))
		}
		var outs []outbox.Outcome
		for _, m := range got {
			var g int
			if _, err := fmt.Sscanf(m.Group, "g%d", &g); err != nil {
				t.Fatal(err)
			}
			if n, want := payloadN(t, m), next[m.Group]*200+g; n != want {
				t.Fatalf("group %s: got message %d, want %d (FIFO)", m.Group, n, want)
			}
			next[m.Group]++
			outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		total += len(got)
		if len(outs) > 0 {
			res, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: outs})
			if err != nil || len(res.LeaseLost) > 0 {
				t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
			}
		}
	}
}

// A message whose transaction drew its sequence number before the claims'
// windows passed it, and committed after, is claimed all the same (the
// backstop probes every registered group, and the unordered messages
// without a done mark).
func TestLogModeLateCommitIsClaimed(t *testing.T) {
	for _, group := range []string{"late", ""} {
		t.Run(fmt.Sprintf("group=%q", group), func(t *testing.T) {
			t.Parallel()
			testLateCommit(t, group)
		})
	}
}

func testLateCommit(t *testing.T, group string) {
	s, ob, _ := newLogStore(t)
	ctx := context.Background()
	// The late one: its seq is drawn now, its commit comes last.
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		if _, err := ob.EnqueueTx(ctx, tx, msg("t", group, -1)); err != nil {
			return err
		}
		// Thousands of later messages are committed, claimed and sent
		// meanwhile: every window moves past the late one's seq.
		for round := range 3 {
			var batch []outbox.Message
			for i := range 2000 {
				batch = append(batch, msg("t", fmt.Sprintf("g%d", i%50), round*2000+i))
			}
			if _, err := ob.Enqueue(ctx, batch...); err != nil {
				return err
			}
			for {
				got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1000, Owner: "p", Now: time.Now()})
				if err != nil {
					return err
				}
				if len(got) == 0 {
					break
				}
				var outs []outbox.Outcome
				for _, m := range got {
					outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
				}
				if _, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: outs}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(45 * time.Second)
	for {
		got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && payloadN(t, got[0]) == -1 {
			return
		}
		if len(got) > 0 {
			t.Fatalf("claimed %d unexpected messages: %+v", len(got), got[0])
		}
		if time.Now().After(deadline) {
			t.Fatal("the late-committed message was never claimed")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A claim passes a group another claim holds (its lock taken) and fills
// its limit from the groups after it; the group is claimed once free.
func TestLogModeClaimPassesHeldGroups(t *testing.T) {
	t.Parallel()
	s, ob, pg := newLogStore(t)
	ctx := context.Background()
	var msgs []outbox.Message
	for i := range 15 {
		msgs = append(msgs, msg("t", fmt.Sprintf("g%d", i/5), i))
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// Another claim's transaction holds g0's lock.
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ns, key := postgres.LogClaimLock(s, "", "t", "g0")
	var ok bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1::int4, hashtext($2))", ns, key).Scan(&ok); err != nil || !ok {
		t.Fatalf("lock g0: %v, %v", ok, err)
	}
	got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int{}
	for _, m := range got {
		groups[m.Group]++
	}
	if len(got) != 10 || groups["g1"] != 5 || groups["g2"] != 5 {
		t.Fatalf("claim with g0 held took %v, want g1 and g2 whole", groups)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got, err = s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || got[0].Group != "g0" {
		t.Fatalf("claim once g0 is free took %d messages (first %+v), want g0's 5", len(got), got)
	}
}

// Prune on the append-only path deletes the messages the marks finished
// (their rows stay PENDING), at most its limit, and sweeps the marks no
// read needs: a group keeps its latest mark and those its live rows read.
func TestLogModePruneSweepsMarks(t *testing.T) {
	t.Parallel()
	s, ob, pg := newLogStore(t)
	ctx := context.Background()
	t0 := time.Now().Add(time.Second)
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, msg("t", fmt.Sprintf("g%d", i%3), i))
	}
	for i := range 5 {
		msgs = append(msgs, msg("t", "", 100+i))
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	sendAll := func(at time.Time, want int) {
		t.Helper()
		total := 0
		for range 100 {
			got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 7, Owner: "p", Now: at})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				break
			}
			var outs []outbox.Outcome
			for _, m := range got {
				outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
			}
			if res, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: at, Outcomes: outs}); err != nil || len(res.LeaseLost) > 0 {
				t.Fatalf("finish: %+v, %v", res, err)
			}
			total += len(got)
		}
		if total != want {
			t.Fatalf("sent %d, want %d", total, want)
		}
	}
	sendAll(t0, 35)
	// Later messages of the same groups, not finished.
	if _, err := ob.Enqueue(ctx, msg("t", "g0", 200), msg("t", "g1", 201), msg("t", "g2", 202)); err != nil {
		t.Fatal(err)
	}
	marks := func() (ordered, unordered int) {
		t.Helper()
		if err := pg.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE part = 0), count(*) FILTER (WHERE part > 0) FROM "+s.Schema()+".outbox_marks").Scan(&ordered, &unordered); err != nil {
			t.Fatal(err)
		}
		return ordered, unordered
	}
	if o, u := marks(); o <= 3 || u != 10 {
		t.Fatalf("marks before the prune: %d ordered, %d unordered; want more than 3 and 10", o, u)
	}
	// Nothing finished before the cutoff: nothing goes.
	if n, err := s.MessagePrune(ctx, outbox.MessagePruneParams{Before: t0.Add(-time.Minute)}); err != nil || n != 0 {
		t.Fatalf("prune before anything finished: %d, %v", n, err)
	}
	n, err := s.MessagePrune(ctx, outbox.MessagePruneParams{Before: t0.Add(time.Minute), Limit: 4})
	if err != nil || n != 4 {
		t.Fatalf("prune with limit 4: %d, %v", n, err)
	}
	n, err = s.MessagePrune(ctx, outbox.MessagePruneParams{Before: t0.Add(time.Minute)})
	if err != nil || n != 31 {
		t.Fatalf("second prune: %d, %v; want the 31 left", n, err)
	}
	cnt, err := s.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || cnt[outbox.StatusPending] != 3 || cnt[outbox.StatusSent] != 0 {
		t.Fatalf("counts after the prune: %v, %v; want 3 PENDING and nothing else", cnt, err)
	}
	if o, u := marks(); o != 3 || u != 0 {
		t.Fatalf("marks after the prune: %d ordered, %d unordered; want each group's latest only", o, u)
	}
	// The groups go on from where their marks left them.
	sendAll(t0.Add(2*time.Minute), 3)
	cnt, err = s.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || cnt[outbox.StatusSent] != 3 || cnt[outbox.StatusPending] != 0 {
		t.Fatalf("counts once the later messages are sent: %v, %v", cnt, err)
	}
}

// The operator's views on the append-only path show the states the marks
// give: a message its group's marks finished is SENT in the topic
// statistics and in a search, one in a live lease PROCESSING.
func TestLogModeAdminSeesMarkedStates(t *testing.T) {
	t.Parallel()
	s, ob, _ := newLogStore(t)
	ctx := context.Background()
	var msgs []outbox.Message
	for i := range 6 {
		msgs = append(msgs, msg("t", "g", i))
	}
	msgs = append(msgs, msg("t", "", 10), msg("t", "", 11))
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Second)
	got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: now})
	if err != nil || len(got) != 8 {
		t.Fatalf("claim: %d messages, %v; want 8", len(got), err)
	}
	// The group's first four and one unordered message are sent; the
	// rest stay leased.
	var outs []outbox.Outcome
	for _, m := range got {
		if (m.Group == "g" && m.Seq <= got[0].Seq+3) || m.Seq == got[len(got)-1].Seq {
			outs = append(outs, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
	}
	if res, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: now, Outcomes: outs}); err != nil || len(res.LeaseLost) > 0 || len(outs) != 5 {
		t.Fatalf("finish %d outcomes: %+v, %v", len(outs), res, err)
	}
	stats, err := s.TopicStats(ctx, outbox.TopicStatsParams{})
	if err != nil || len(stats) != 1 {
		t.Fatalf("topic stats: %+v, %v", stats, err)
	}
	if c := stats[0].Counts; c[outbox.StatusSent] != 5 || c[outbox.StatusProcessing] != 3 || c[outbox.StatusPending] != 0 {
		t.Fatalf("topic stats counts %v, want 5 SENT and 3 PROCESSING", c)
	}
	page, err := s.MessageSearch(ctx, outbox.MessageSearchParams{Filter: outbox.MessageFilter{Status: outbox.StatusSent}, Limit: 100})
	if err != nil || len(page.Messages) != 5 {
		t.Fatalf("search for SENT: %d messages, %v; want 5", len(page.Messages), err)
	}
	for _, m := range page.Messages {
		if m.Status != outbox.StatusSent || m.SentAt.IsZero() {
			t.Fatalf("searched message %+v, want SENT with its sent time", m)
		}
	}
}

// A message enqueued after a claim's clock was read is not due to that
// claim; the next claim takes it, not a later backstop or the next message
// of its group.
func TestLogModeMessageNewerThanTheClaimsClock(t *testing.T) {
	t.Parallel()
	s, ob, _ := newLogStore(t)
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	if _, err := ob.Enqueue(ctx, msg("t", "g", 1), msg("t", "", 2)); err != nil {
		t.Fatal(err)
	}
	got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: before})
	if err != nil || len(got) != 0 {
		t.Fatalf("claim at a clock before the enqueue: %d messages, %v; want none", len(got), err)
	}
	got, err = s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
	if err != nil || len(got) != 2 {
		t.Fatalf("next claim: %d messages, %v; want both", len(got), err)
	}
}
