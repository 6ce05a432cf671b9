package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

// Run runs the whole conformance suite against the store h builds. Every
// area is a subtest; every leaf subtest runs in parallel on its own backend
// (h.NewBackend). The "Processor" subtests run real outbox.Processors
// against the store.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	t.Helper()
	if h.NewBackend == nil {
		t.Fatal("storetest: Harness.NewBackend is nil")
	}
	known := map[Capability]bool{}
	for _, c := range Capabilities() {
		known[c] = true
	}
	for _, c := range h.Features.Lacks {
		if !known[c] {
			t.Fatalf("storetest: Features.Lacks names %q, which is not a Capability of the suite", c)
		}
	}
	t.Run("Enqueue", func(t *testing.T) { testEnqueue(t, h) })
	t.Run("Payload", func(t *testing.T) { testPayload(t, h) })
	t.Run("Claim", func(t *testing.T) { testClaim(t, h) })
	t.Run("FIFO", func(t *testing.T) { testFIFO(t, h) })
	t.Run("Finish", func(t *testing.T) { testFinish(t, h) })
	t.Run("Recover", func(t *testing.T) { testRecover(t, h) })
	t.Run("DeadLetter", func(t *testing.T) { testDeadLetter(t, h) })
	t.Run("Lease", func(t *testing.T) { testLease(t, h) })
	t.Run("Operator", func(t *testing.T) { testOperator(t, h) })
	t.Run("Receipts", func(t *testing.T) { testReceipts(t, h) })
	t.Run("Query", func(t *testing.T) { testQuery(t, h) })
	t.Run("Inbox", func(t *testing.T) { testInbox(t, h) })
	t.Run("Optional", func(t *testing.T) { testOptional(t, h) })
	t.Run("Admin", func(t *testing.T) { testAdmin(t, h) })
	t.Run("Validation", func(t *testing.T) { testValidation(t, h) })
	t.Run("Processor", func(t *testing.T) { testProcessor(t, h) })
}

// env is one subtest's world: a fresh backend, a context, a fixed clock
// (t0, whole milliseconds, so every store stores it exactly) and an Outbox
// over the backend.
type env[TTx any] struct {
	t  *testing.T
	h  Harness[TTx]
	b  Backend[TTx]
	s  outbox.Store
	ob *outbox.Outbox[TTx]
	// ctx ends with the subtest.
	ctx context.Context
	t0  time.Time
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// setup marks t parallel and builds its env.
func setup[TTx any](t *testing.T, h Harness[TTx]) *env[TTx] {
	t.Helper()
	t.Parallel()
	b := h.NewBackend(t)
	if b.Store == nil || b.Enqueuer == nil || b.Begin == nil || b.Commit == nil || b.Rollback == nil || b.Usable == nil {
		t.Fatal("storetest: the Backend lacks a field")
	}
	if len(h.Features.Topics) > 0 {
		b = mapTopics(t, b, h.Features.Topics)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	return &env[TTx]{
		t: t, h: h, b: b, s: b.Store, ctx: ctx, t0: t0,
		ob: outbox.New[TTx](b.Enqueuer, outbox.Options{Clock: fixedClock{t0}}),
	}
}

// at returns t0 + d.
func (e *env[TTx]) at(d time.Duration) time.Time { return e.t0.Add(d) }

// msg returns a valid message of topic and group with payload {"n": n}.
func msg(topic, group string, n int) outbox.Message {
	return outbox.Message{Topic: topic, Group: group, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// enqueue enqueues msgs in the store's own transaction and returns the stored
// messages.
func (e *env[TTx]) enqueue(msgs ...outbox.Message) []outbox.Message {
	e.t.Helper()
	res, err := e.ob.Enqueue(e.ctx, msgs...)
	require.NoError(e.t, err, "Enqueue")
	if len(res) != len(msgs) {
		e.t.Fatalf("Enqueue returned %d results for %d messages", len(res), len(msgs))
	}
	out := make([]outbox.Message, len(res))
	for i, r := range res {
		if r.Existed {
			e.t.Fatalf("Enqueue: message %d unexpectedly existed", i)
		}
		out[i] = r.Message
	}
	return out
}

// enqueueN enqueues n messages of topic and group (payload n = 0..n-1).
func (e *env[TTx]) enqueueN(topic, group string, n int) []outbox.Message {
	e.t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msg(topic, group, i)
	}
	return e.enqueue(msgs...)
}

func (e *env[TTx]) claimP(p outbox.MessageClaimParams) []outbox.Message {
	e.t.Helper()
	got, err := e.s.MessageClaim(e.ctx, p)
	require.NoError(e.t, err, "MessageClaim(%+v)", p)
	for i := 1; i < len(got); i++ {
		if got[i-1].Seq >= got[i].Seq {
			e.t.Fatalf("MessageClaim returned messages out of Seq order: %d then %d", got[i-1].Seq, got[i].Seq)
		}
	}
	return got
}

// claim claims up to limit messages of any topic for owner at time now.
func (e *env[TTx]) claim(owner string, limit int, now time.Time) []outbox.Message {
	e.t.Helper()
	return e.claimP(outbox.MessageClaimParams{Limit: limit, Owner: owner, Now: now})
}

// claimUntilNonePending yields owner's claims of up to limit messages at
// e.t0, from any goroutine, until nothing is pending. An empty claim is not
// the end: with concurrent claimers it only means that what is left is
// locked or held by the others (SKIP LOCKED, a head in flight), so the loop
// counts the pending messages, waits and claims again. It yields an error,
// and stops, when a call fails or 1,000 claims in a row return nothing while
// messages are pending.
func (e *env[TTx]) claimUntilNonePending(owner string, limit int) iter.Seq2[[]outbox.Message, error] {
	return func(yield func([]outbox.Message, error) bool) {
		for empty := 0; ; {
			batch, err := e.s.MessageClaim(e.ctx, outbox.MessageClaimParams{Limit: limit, Owner: owner, Now: e.t0})
			if err != nil {
				yield(nil, err)
				return
			}
			if len(batch) > 0 {
				empty = 0
				if !yield(batch, nil) {
					return
				}
				continue
			}
			c, err := e.s.MessageCount(e.ctx, outbox.MessageCountParams{})
			if err != nil {
				yield(nil, err)
				return
			}
			if c[outbox.StatusPending] == 0 {
				return
			}
			if empty++; empty > 1000 {
				yield(nil, fmt.Errorf("%s: 1,000 claims in a row returned nothing while %d messages were pending", owner, c[outbox.StatusPending]))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func (e *env[TTx]) get(tenant, id string) outbox.Message {
	e.t.Helper()
	m, err := e.s.MessageGet(e.ctx, outbox.MessageGetParams{Tenant: tenant, ID: id})
	require.NoError(e.t, err, "MessageGet(%q, %s)", tenant, id)
	return m
}

func (e *env[TTx]) finish(p outbox.MessageFinishParams) outbox.FinishResult {
	e.t.Helper()
	res, err := e.s.MessageFinish(e.ctx, p)
	require.NoError(e.t, err, "MessageFinish")
	return res
}

// sent records a successful publish of each m (claimed by owner) at now.
func (e *env[TTx]) sent(owner string, now time.Time, msgs ...outbox.Message) {
	e.t.Helper()
	p := outbox.MessageFinishParams{Owner: owner, Now: now}
	for _, m := range msgs {
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "prov-" + m.ID, StartedAt: now})
	}
	if res := e.finish(p); len(res.LeaseLost) > 0 {
		e.t.Fatalf("MessageFinish: unexpected LeaseLost %v", res.LeaseLost)
	}
}

func (e *env[TTx]) attempts(tenant, id string) []outbox.Attempt {
	e.t.Helper()
	a, err := e.s.AttemptList(e.ctx, outbox.AttemptListParams{Tenant: tenant, MessageID: id})
	require.NoError(e.t, err, "AttemptList(%q, %s)", tenant, id)
	return a
}

func (e *env[TTx]) count(tenant string) map[outbox.Status]int64 {
	e.t.Helper()
	c, err := e.s.MessageCount(e.ctx, outbox.MessageCountParams{Tenant: tenant})
	require.NoError(e.t, err, "MessageCount(%q)", tenant)
	return c
}

func (e *env[TTx]) begin() TTx {
	e.t.Helper()
	tx, err := e.b.Begin(e.ctx)
	require.NoError(e.t, err, "Begin")
	// A test that fails with tx open ends it here, before the backend's
	// own clean-up, which would otherwise wait for its locks. After a
	// commit or rollback this does nothing (its error is ignored).
	e.t.Cleanup(func() { _ = e.b.Rollback(context.WithoutCancel(e.ctx), tx) })
	return tx
}

func (e *env[TTx]) commit(tx TTx) {
	e.t.Helper()
	require.NoError(e.t, e.b.Commit(e.ctx, tx), "Commit")
}

func (e *env[TTx]) usable(tx TTx) {
	e.t.Helper()
	require.NoError(e.t, e.b.Usable(e.ctx, tx), "the caller's transaction is no longer usable")
}

// wantStatus fails unless the message is in status want.
func (e *env[TTx]) wantStatus(tenant, id string, want outbox.Status) outbox.Message {
	e.t.Helper()
	m := e.get(tenant, id)
	if m.Status != want {
		e.t.Fatalf("message %s: status %s, want %s", id, m.Status, want)
	}
	return m
}

// ids returns the IDs of msgs.
func ids(msgs []outbox.Message) []string {
	out := make([]string, len(msgs))
	for i := range msgs {
		out[i] = msgs[i].ID
	}
	return out
}

// wantIDs fails unless got holds exactly the IDs of want, in order.
func wantIDs(t *testing.T, what string, got []outbox.Message, want ...outbox.Message) {
	t.Helper()
	g, w := ids(got), ids(want)
	if strings.Join(g, ",") != strings.Join(w, ",") {
		t.Fatalf("%s: got %v, want %v", what, g, w)
	}
}

func sameTime(a, b time.Time) bool { return a.Equal(b) }

func wantTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !sameTime(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func wantErrIs(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one matching %v", what, err, target)
	}
}

func wantCounts(t *testing.T, got map[outbox.Status]int64, want map[outbox.Status]int64) {
	t.Helper()
	for _, st := range outbox.Statuses() {
		n, ok := got[st]
		if !ok {
			t.Fatalf("MessageCount: status %s missing from %v (every status must be present)", st, got)
		}
		if n != want[st] {
			t.Fatalf("MessageCount: %s = %d, want %d (all: %v)", st, n, want[st], got)
		}
	}
}

// set is a concurrency-safe string multiset, for the concurrency tests.
type set struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *set) add(k string) {
	s.mu.Lock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[k]++
	s.mu.Unlock()
}

func (s *set) dups() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, n := range s.n {
		if n > 1 {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
