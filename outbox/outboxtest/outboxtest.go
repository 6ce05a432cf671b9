// Package outboxtest helps applications test code that uses outboxkit: a
// recording publisher, a fake clock, and assertions on what was enqueued
// (in a transaction or committed) and on a drained store.
//
//	ob := outbox.New(store, outbox.Options{})
//	tx, _ := db.BeginTx(ctx, nil)
//	placeOrder(ctx, tx, ob) // your code, enqueues in tx
//	outboxtest.RequireEnqueuedTx(t, store, tx, outboxtest.Want{Topic: "orders", Count: 1})
//
// It imports only the core and the standard library.
package outboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Want describes the messages an assertion expects. Zero fields match
// anything; Count 0 means "at least one".
type Want struct {
	Tenant string
	Topic  string
	Group  string
	Status outbox.Status
	// ContentType, when set, must equal the message's content type
	// exactly ("" matches any).
	ContentType string
	// Payload, when set, must equal the message payload: as JSON (key order
	// and spacing ignored) when the message's content type is JSON, byte
	// for byte otherwise.
	Payload []byte
	Count   int
}

// TxLister is implemented by stores that can list messages inside a caller's
// transaction, seeing what it enqueued before it commits.
type TxLister[TTx any] interface {
	MessageListTx(ctx context.Context, tx TTx, p outbox.MessageListParams) (outbox.MessagePage, error)
}

// RequireEnqueued fails t unless the store holds messages matching w, and
// returns them.
func RequireEnqueued(t testing.TB, store outbox.Store, w Want) []outbox.Message {
	t.Helper()
	list := func(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
		return store.MessageList(ctx, p)
	}
	return require(t, list, w)
}

// RequireEnqueuedTx fails t unless tx (not yet committed) holds messages
// matching w, and returns them.
func RequireEnqueuedTx[TTx any](t testing.TB, store TxLister[TTx], tx TTx, w Want) []outbox.Message {
	t.Helper()
	list := func(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
		return store.MessageListTx(ctx, tx, p)
	}
	return require(t, list, w)
}

func require(t testing.TB, list func(context.Context, outbox.MessageListParams) (outbox.MessagePage, error), w Want) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	var found []outbox.Message
	p := outbox.MessageListParams{Tenant: w.Tenant, Topic: w.Topic, Group: w.Group, Status: w.Status, Limit: 1000}
	for {
		page, err := list(ctx, p)
		if err != nil {
			t.Fatalf("outboxtest: listing messages: %v", err)
		}
		for _, m := range page.Messages {
			if (w.ContentType == "" || m.ContentType == w.ContentType) && (w.Payload == nil || payloadEqual(&m, w.Payload)) {
				found = append(found, m)
			}
		}
		if page.NextAfterSeq == 0 {
			break
		}
		p.AfterSeq = page.NextAfterSeq
	}
	switch {
	case w.Count == 0 && len(found) == 0:
		t.Fatalf("outboxtest: no message matches %+v", w)
	case w.Count > 0 && len(found) != w.Count:
		t.Fatalf("outboxtest: %d messages match %+v, want %d", len(found), w, w.Count)
	}
	return found
}

func payloadEqual(m *outbox.Message, want []byte) bool {
	if m.IsJSON() {
		return jsonEqual(m.Payload, want)
	}
	return bytes.Equal(m.Payload, want)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

// WaitDrained waits until the tenant has no PENDING or PROCESSING message
// left, polling the store, and fails t after timeout. It returns the final
// counts by status.
func WaitDrained(t testing.TB, store outbox.Store, tenant string, timeout time.Duration) map[outbox.Status]int64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, err := store.MessageCount(context.Background(), outbox.MessageCountParams{Tenant: tenant})
		if err != nil {
			t.Fatalf("outboxtest: counting messages: %v", err)
		}
		if c[outbox.StatusPending] == 0 && c[outbox.StatusProcessing] == 0 {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("outboxtest: store not drained after %s: %v", timeout, c)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Publication is one call's view of one message seen by a Recorder.
type Publication struct {
	Message outbox.Message
	Result  outbox.Result
	At      time.Time
}

// Recorder is a Publisher for tests: it records every message it publishes
// and answers with Func's result (success with ProviderMessageID "p-<ID>"
// when Func is nil). Like a well-behaved publisher it stops an ordered group
// at its first failure in a batch: the group's later messages get
// outbox.ErrNotAttempted and are not recorded. It is safe for concurrent use.
type Recorder struct {
	// Func decides the result of each message; nil means success.
	Func func(m outbox.Message) outbox.Result

	mu   sync.Mutex
	pubs []Publication
}

// Publish records msgs and returns their results.
func (r *Recorder) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	out := make([]outbox.Result, len(msgs))
	stopped := map[string]bool{}
	for i, m := range msgs {
		if err := ctx.Err(); err != nil {
			out[i] = outbox.Result{Err: errors.Join(outbox.ErrNotAttempted, err)}
			continue
		}
		if m.Group != "" && stopped[m.GroupKey()] {
			out[i] = outbox.Result{Err: outbox.ErrNotAttempted}
			continue
		}
		res := outbox.Result{ProviderMessageID: "p-" + m.ID}
		if r.Func != nil {
			res = r.Func(m)
		}
		out[i] = res
		if res.Err != nil && m.Group != "" {
			stopped[m.GroupKey()] = true
		}
		r.mu.Lock()
		r.pubs = append(r.pubs, Publication{Message: m, Result: res, At: time.Now()})
		r.mu.Unlock()
	}
	return out
}

// Publications returns a copy of everything published so far, in call order.
func (r *Recorder) Publications() []Publication {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Publication(nil), r.pubs...)
}

// Sent returns the IDs of the messages published successfully, in order.
func (r *Recorder) Sent() []string {
	var ids []string
	for _, p := range r.Publications() {
		if p.Result.Err == nil {
			ids = append(ids, p.Message.ID)
		}
	}
	return ids
}

// Clock is a settable outbox.Clock for tests. The zero value starts at
// 2026-01-01T00:00:00Z.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t.UTC()} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.Now()
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t.UTC()
	c.mu.Unlock()
}
