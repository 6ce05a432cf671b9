package postgres

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestClaimLookupsStartAtGroupFloors: while a transaction holds the cleanup
// horizon, every message a group had leaves dead entries in the group and
// lease indexes. A claim's lookups of the group's first waiting and first
// leased message start at the group's floor (the head of the store's last
// claim of it), so their work stays flat however long the group's history
// since the hold is; from the group's first entry, it grows with it.
func TestClaimLookupsStartAtGroupFloors(t *testing.T) {
	s, pg, ctx := migratedStore(t, Options{})
	pg.HoldHorizon(t, 1)
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	const rounds, per = 40, 10
	for r := range rounds + 1 {
		msgs := make([]outbox.Message, per)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(fmt.Sprint(r*per + i))}
		}
		if _, err := ob.Enqueue(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
		if r == rounds {
			break // the last run stays PENDING: the claim below looks it up
		}
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: per, Owner: "p", Now: time.Now()})
		if err != nil || len(ms) != per {
			t.Fatalf("round %d: claimed %d, %v; want %d", r, len(ms), err, per)
		}
		p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		if _, err := s.MessageFinish(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	floors := s.floors.json()
	var fl map[string]any
	if err := json.Unmarshal([]byte(floors), &fl); err != nil || fl[floorKey("", "t", "g")] == nil || fl[""] == nil {
		t.Fatalf("floors %s (%v): want one for group g, and the server", floors, err)
	}
	// The buffers the heads' lookups read: the group index's (first
	// waiting) and the lease index's (first leased).
	lookups := func(floors string) int {
		t.Helper()
		plan := section(explainIn(t, ctx, s.db, planSettings, "(ANALYZE, BUFFERS, COSTS OFF) "+s.sql.claimAll,
			time.Now(), "q", 500, 2000, 100, int64(0), floors), "CTE heads", "CTE runs")
		total := 0
		re := regexp.MustCompile(`Index Only Scan using \w*messages_(group_waiting|leased)[^\n]*\n(?:[^\n]*\n)*?\s*Buffers: shared hit=(\d+)(?: read=(\d+))?`)
		for _, m := range re.FindAllStringSubmatch(plan, -1) {
			hit, _ := strconv.Atoi(m[2])
			read, _ := strconv.Atoi(m[3])
			total += hit + read
		}
		if total == 0 {
			t.Fatalf("no buffer figures for the heads' lookups:\n%s", plan)
		}
		return total
	}
	fromFloor, fromStart := lookups(floors), lookups("{}")
	t.Logf("heads' lookups: %d buffers from the group's floor, %d from its first entry (%d messages since the hold)", fromFloor, fromStart, rounds*per)
	if fromFloor*4 > fromStart {
		t.Fatalf("lookups from the floor read %d buffers, from the first entry %d: want under a quarter", fromFloor, fromStart)
	}
	// The floor changes the work, not the answer: the claim takes the
	// waiting run, in order.
	ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 2 * per, Owner: "p", Now: time.Now()})
	if err != nil || len(ms) != per {
		t.Fatalf("last claim: %d, %v; want the %d waiting", len(ms), err, per)
	}
	for i, m := range ms {
		if string(m.Payload) != fmt.Sprint(rounds*per+i) {
			t.Fatalf("message %d of the last claim is %s, want %d", i, m.Payload, rounds*per+i)
		}
	}
}

// TestRequeueMovesAnOvertakenDeadLetterToTheEnd: a dead letter that did not
// hold its group was overtaken by its group's later messages, and the
// store's floor of the group is past it. Requeued, it takes a new sequence
// number: it is its group's last message, claimed after the ones enqueued
// before the requeue and never beside them. A floor above a waiting message
// (one the store could not know of) does not strand it either.
func TestRequeueMovesAnOvertakenDeadLetterToTheEnd(t *testing.T) {
	s, _, ctx := migratedStore(t, Options{})
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	enqueue := func(payload string) outbox.Message {
		t.Helper()
		res, err := ob.Enqueue(ctx, outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(payload)})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Message
	}
	claim := func(owner string, limit int) []outbox.Message {
		t.Helper()
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: limit, Owner: owner, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	finish := func(owner string, os ...outbox.Outcome) {
		t.Helper()
		if _, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: owner, Now: time.Now(), Outcomes: os}); err != nil {
			t.Fatal(err)
		}
	}
	m1, m2 := enqueue(`1`), enqueue(`2`)
	c := claim("p", 1)
	finish("p", outbox.Outcome{Kind: outbox.OutcomeDead, Topic: "t", ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, Error: &outbox.ErrorInfo{Code: "x"}})
	c = claim("p", 1) // m2: the floor of g is now m2's
	if len(c) != 1 || c[0].ID != m2.ID {
		t.Fatalf("second claim: %v, want m2", c)
	}
	finish("p", outbox.Outcome{Kind: outbox.OutcomeSent, Topic: "t", ID: m2.ID, Attempt: 1, ClaimToken: c[0].ClaimToken})
	m3 := enqueue(`3`)
	rq, err := s.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: m1.ID, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if rq.Seq <= m3.Seq {
		t.Fatalf("requeued dead letter has seq %d, want after m3's %d", rq.Seq, m3.Seq)
	}
	if c = claim("p", 10); len(c) != 2 || c[0].ID != m3.ID || c[1].ID != m1.ID {
		t.Fatalf("claim after the requeue: %v, want m3 then m1", c)
	}
	finish("p", outbox.Outcome{Kind: outbox.OutcomeSent, Topic: "t", ID: m3.ID, Attempt: 1, ClaimToken: c[0].ClaimToken},
		outbox.Outcome{Kind: outbox.OutcomeReleased, Topic: "t", ID: m1.ID, Attempt: 1, ClaimToken: c[1].ClaimToken})

	// A floor past a waiting message (made up here) is ignored for it.
	s.floors.claimed([]outbox.Message{{Topic: "t", Group: "g", Seq: rq.Seq + 100}})
	if c = claim("q", 10); len(c) != 1 || c[0].ID != m1.ID {
		t.Fatalf("claim under a floor past m1: %v, want m1", c)
	}
}

// TestFloorsHoldOnlyOnTheirServer: floors learned on another server (before
// a failover to a standby that had not received the last sequence numbers,
// which it then draws again) are not applied, and are dropped. Here a floor
// past a leased message would otherwise let the group's next message be
// claimed beside it.
func TestFloorsHoldOnlyOnTheirServer(t *testing.T) {
	s, _, ctx := migratedStore(t, Options{})
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	res, err := ob.Enqueue(ctx,
		outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(`1`)},
		outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(`2`)})
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 1, Owner: "p", Now: time.Now()}); err != nil || len(ms) != 1 || ms[0].ID != res[0].Message.ID {
		t.Fatalf("first claim: %v, %v; want the first message", ms, err)
	}
	server := s.floors.server
	s.floors.onServer("another server")
	s.floors.claimed([]outbox.Message{{Topic: "t", Group: "g", Seq: res[1].Message.Seq}})
	if ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "q", Now: time.Now()}); err != nil || len(ms) != 0 {
		t.Fatalf("claim while the first is leased, under another server's floor: %v, %v; want nothing", ms, err)
	}
	if s.floors.server != server || len(s.floors.cur)+len(s.floors.old) != 0 {
		t.Fatalf("after a claim on %q: floors of %q, %d kept; want the other server's dropped", server, s.floors.server, len(s.floors.cur)+len(s.floors.old))
	}
}
