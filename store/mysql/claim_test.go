package mysql_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// enqueueGroups enqueues n messages of topic "bench" over groups groups
// (message i in group i % groups), 1,000 per transaction.
func enqueueGroups(t *testing.T, st *mysql.Store, n, groups int) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		msgs := make([]outbox.Message, min(1000, n-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench", Group: fmt.Sprintf("g%d", (i+j)%groups), Payload: []byte(`{"n":1}`)}
		}
		if _, err := st.MessageEnqueue(context.Background(), outbox.MessageEnqueueParams{Messages: msgs}); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
	}
}

// medianClaim returns the median time of 7 claims of 100 messages on a
// store holding backlog messages in 1,000 groups. ClaimPerGroup is 1, so
// every claim takes the heads of 100 groups whatever the backlog: only the
// backlog differs between calls.
func medianClaim(t *testing.T, backlog int) time.Duration {
	st, _ := newStore(t, mysql.Options{ClaimPerGroup: 1})
	enqueueGroups(t, st, backlog, 1000)
	var times []time.Duration
	for i := range 7 {
		start := time.Now()
		got, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 100, Owner: fmt.Sprintf("p%d", i), Topics: []string{"bench"}, Now: time.Now()})
		times = append(times, time.Since(start))
		if err != nil || len(got) != 100 {
			t.Fatalf("claim %d: %d messages, %v", i, len(got), err)
		}
	}
	slices.Sort(times)
	return times[len(times)/2]
}

// TestClaimCostDoesNotGrowWithBacklog: a claim over a backlog ten times as
// long costs about the same. The head scan read and sorted every PENDING
// ordered message before it had an index in sequence order (migration 7):
// 10x here, 1.2-1.9 s for a claim of 500 over 100,000 messages.
func TestClaimCostDoesNotGrowWithBacklog(t *testing.T) {
	t.Parallel()
	small := medianClaim(t, 2000)
	large := medianClaim(t, 20000)
	ratio := float64(large) / float64(small)
	t.Logf("median claim of 100: %v over 2,000 messages, %v over 20,000 (%.2fx)", small, large, ratio)
	// Generous for a shared machine; the scan of the whole backlog gave
	// about 10x.
	if ratio > 3 && large-small > 20*time.Millisecond {
		t.Errorf("a claim over 20,000 messages takes %.1fx one over 2,000 (%v vs %v)", ratio, large, small)
	}
}

// TestClaimLooksPastBlockedBacklog: when the oldest pending messages all
// belong to a group that is blocked (its head is in flight), filling the
// claim's window, the claim still finds the groups behind them.
func TestClaimLooksPastBlockedBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mysql.Options{})
	big := make([]outbox.Message, 2500)
	for i := range big {
		big[i] = outbox.Message{Tenant: "t", Topic: "big", Group: "big", Payload: []byte(`{}`)}
	}
	first, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: big})
	if err != nil {
		t.Fatal(err)
	}
	others, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{
		{Tenant: "t", Topic: "big", Group: "a", Payload: []byte(`{}`)},
		{Tenant: "t", Topic: "big", Group: "b", Payload: []byte(`{}`)},
		{Tenant: "u", Topic: "big", Group: "c", Payload: []byte(`{}`)},
		{Tenant: "t", Topic: "big", Payload: []byte(`{}`)},
		{Tenant: "t", Topic: "other", Group: "d", Payload: []byte(`{}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(owner string, limit int, topics ...string) []outbox.Message {
		t.Helper()
		got, err := st.MessageClaim(ctx, outbox.MessageClaimParams{Limit: limit, Owner: owner, Topics: topics, Now: time.Now()})
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		return got
	}
	if head := claim("p", 1, "big"); len(head) != 1 || head[0].ID != first[0].Message.ID {
		t.Fatalf("first claim: %+v", head)
	}
	// The window (1,000 messages at least) holds only blocked messages of
	// group big; the claim finds a, b, c and the unordered one behind them.
	got := claim("q", 50, "big")
	want := map[string]bool{}
	for _, o := range others[:4] {
		want[o.Message.ID] = true
	}
	if len(got) != len(want) {
		t.Fatalf("claimed %d messages (%v), want the %d behind the blocked backlog", len(got), groupsOf(got), len(want))
	}
	for _, m := range got {
		if !want[m.ID] {
			t.Fatalf("claimed %s of group %q", m.ID, m.Group)
		}
	}
	if more := claim("r", 50, "big"); len(more) != 0 {
		t.Fatalf("claimed %d more of topic big: %v", len(more), groupsOf(more))
	}
	// Without a topic filter: the one message of topic other.
	if rest := claim("r", 50); len(rest) != 1 || rest[0].ID != others[4].Message.ID {
		t.Fatalf("claim without topics: %v", groupsOf(rest))
	}
}

func groupsOf(ms []outbox.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Tenant+"/"+m.Group)
	}
	return out
}

// TestClaimManyGroupsInRounds: a claim that needs more groups than one
// statement takes (1,000) locks them in several rounds and still returns
// every group's head, in order.
func TestClaimManyGroupsInRounds(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t, mysql.Options{ClaimPerGroup: 1})
	enqueueGroups(t, st, 5000, 2500) // two messages in each of 2,500 groups
	got, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 3000, Owner: "p", Topics: []string{"bench"}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	// 2,500 heads, then the room left goes to second messages of the
	// first groups (runs extended past ClaimPerGroup).
	if len(got) != 3000 {
		t.Fatalf("claimed %d, want 3000", len(got))
	}
	seen := map[string]int{}
	for i, m := range got {
		if i > 0 && m.Seq <= got[i-1].Seq {
			t.Fatalf("claim not in sequence order at %d", i)
		}
		seen[m.Group]++
	}
	if len(seen) != 2500 {
		t.Fatalf("claimed messages of %d groups, want every one of 2,500", len(seen))
	}
}
