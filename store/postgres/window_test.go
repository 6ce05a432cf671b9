package postgres

import (
	"encoding/json"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestClaimWindowFindsMessagesBehindItsStart: a message that is PENDING
// again behind where the claims' window starts (here a release, with no
// margin) is claimed once the window is read from the start again, and
// its group's later message, which the window sees, waits for it.
func TestClaimWindowFindsMessagesBehindItsStart(t *testing.T) {
	s, _, ctx := migratedStore(t, Options{})
	const rescan = 2 * time.Second
	s.windows.margin, s.windows.rescan = 0, rescan
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	res, err := ob.Enqueue(ctx,
		outbox.Message{Topic: "t", Group: "a", Payload: json.RawMessage(`1`)},
		outbox.Message{Topic: "t", Group: "b", Payload: json.RawMessage(`2`)},
		outbox.Message{Topic: "t", Group: "a", Payload: json.RawMessage(`3`)})
	if err != nil {
		t.Fatal(err)
	}
	a1, b1, a2 := res[0].Message, res[1].Message, res[2].Message
	claim := func(limit int) []outbox.Message {
		t.Helper()
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: limit, Owner: "p", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	start := time.Now()
	first := claim(1)
	if len(first) != 1 || first[0].ID != a1.ID { // from the start
		t.Fatalf("first claim: %v, want a1", first)
	}
	if ms := claim(1); len(ms) != 1 || ms[0].ID != b1.ID { // from a1; its first is b1
		t.Fatalf("second claim: %v, want b1", ms)
	}
	if _, err := s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeReleased, Topic: "t", ID: a1.ID, Attempt: 1, ClaimToken: first[0].ClaimToken},
	}}); err != nil {
		t.Fatal(err)
	}
	// The window now starts at b1: a1 is behind it, a2 in it.
	ms := claim(10)
	if time.Since(start) < rescan && len(ms) != 0 {
		t.Fatalf("claim from b1 took %v, want nothing (a1 is behind the window, a2 waits for it)", ms)
	}
	deadline := time.Now().Add(rescan + 10*time.Second)
	for len(ms) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		ms = claim(10)
	}
	if len(ms) == 0 || ms[0].ID != a1.ID {
		t.Fatalf("after the rescan: %v, want a1 first", ms)
	}
	if len(ms) > 1 && ms[1].ID != a2.ID {
		t.Fatalf("after the rescan: %v, want a1 then a2", ms)
	}
}

// TestClaimWindowSkipsClaimedEntries: after a drain, the claims' window
// starts past the claim-index entries of the messages claimed (which stay
// until a vacuum), so a claim reads a few index pages instead of walking
// them all.
func TestClaimWindowSkipsClaimedEntries(t *testing.T) {
	s, pg, ctx := migratedStore(t, Options{})
	s.windows.margin = 1000 // of 10,000 in use: this drain is short
	// No read from the start but the first: on a loaded machine a second
	// passes between two claims, and the check below is of where the
	// window starts after the drain's claims.
	s.windows.rescan = time.Hour
	const n, drained = 80_000, 76_000
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+s.messages+` (id, tenant, topic, grp, idempotency_key, status,
	next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, 'default', 't', 'g' || (i % 100), 'm' || i, 'PENDING', now() - interval '1 second', now(), now(), '{}'::json
FROM generate_series(1, $1::int) AS i`, n); err != nil {
		t.Fatal(err)
	}
	for done := 0; done < drained; {
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			t.Fatalf("nothing claimed after %d", done)
		}
		p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		if _, err := s.MessageFinish(ctx, p); err != nil {
			t.Fatal(err)
		}
		done += len(ms)
	}
	var first int64
	if err := pg.Pool.QueryRow(ctx, `SELECT min(seq) FROM `+s.messages+` WHERE status = 'PENDING'`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	low, full := s.windows.start("", time.Now())
	if full || low > first || low < first-s.windows.margin-1000 {
		t.Fatalf("window starts at %d (from the start: %v); the first pending message is %d", low, full, first)
	}
	buffers := func(low int64) int {
		t.Helper()
		plan := explainIn(t, ctx, s.db, planSettings, "(ANALYZE, BUFFERS, COSTS OFF) "+s.sql.claimAll, time.Now(), "q", 500, 2000, 100, low, "{}")
		m := regexp.MustCompile(`Index Scan using \w*messages_claim_ordered[^\n]*\n(?:[^\n]*\n)*?\s*Buffers: shared hit=(\d+)(?: read=(\d+))?`).FindStringSubmatch(plan)
		if m == nil {
			t.Fatalf("no buffer figures for the window's index scan:\n%s", plan)
		}
		hit, _ := strconv.Atoi(m[1])
		read := 0
		if m[2] != "" {
			read, _ = strconv.Atoi(m[2])
		}
		return hit + read
	}
	fromStart, fromLow := buffers(0), buffers(low)
	t.Logf("window index buffers: %d from the start, %d from %d", fromStart, fromLow, low)
	if fromLow*4 > fromStart {
		t.Fatalf("window from %d read %d index buffers, from the start %d: want under a quarter", low, fromLow, fromStart)
	}

	// Drained to the end, a window read from the start is empty: the next
	// ones start near the last message claimed, not from the start (else
	// every claim of a trickle after one that took everything would walk
	// the whole index again).
	var last int64
	for {
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			break
		}
		last = ms[len(ms)-1].Seq
		p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		if _, err := s.MessageFinish(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	s.windows.rescan = 0 // the next claim reads from the start, and finds nothing
	if ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 500, Owner: "p", Now: time.Now()}); err != nil || len(ms) != 0 {
		t.Fatalf("claim of a drained table: %v, %v", ms, err)
	}
	s.windows.rescan = time.Hour
	low, full = s.windows.start("", time.Now())
	if full || low != last+1-s.windows.margin {
		t.Fatalf("after an empty window read from the start, the next starts at %d (from the start: %v), want %d (the last claimed %d, less the margin)",
			low, full, last+1-s.windows.margin, last)
	}
	fromStart, fromLow = buffers(0), buffers(low)
	t.Logf("drained: window index buffers: %d from the start, %d from %d", fromStart, fromLow, low)
	if fromLow*4 > fromStart {
		t.Fatalf("drained: window from %d read %d index buffers, from the start %d: want under a quarter", low, fromLow, fromStart)
	}
}
