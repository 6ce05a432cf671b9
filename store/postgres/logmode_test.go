package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// newLogStore is a migrated store on the append-only path.
func newLogStore(t *testing.T) (*postgres.Store, *outbox.Outbox[pgx.Tx]) {
	t.Helper()
	s, _ := newStore(t, false)
	postgres.EnableLogMode(s)
	return s, outbox.New[pgx.Tx](s, outbox.Options{})
}

// A claim takes at most its limit, however many groups its windows hold
// and however long their runs: runs are cut to a prefix, oldest first.
func TestLogModeClaimKeepsItsLimit(t *testing.T) {
	t.Parallel()
	s, ob := newLogStore(t)
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
	s, ob := newLogStore(t)
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
	s, pg := newStore(t, false)
	postgres.EnableLogMode(s)
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
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
