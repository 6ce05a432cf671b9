package seedtest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

var T0 = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

// Near reports whether got is within a minute of want (the database's clock
// moves while a test runs).
func Near(got, want time.Time) bool {
	d := got.Sub(want)
	return d > -time.Minute && d < time.Minute
}

// IDs returns the ids of msgs.
func IDs(msgs []outbox.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// Claim claims up to limit messages from st as owner p1, or fails the test.
func Claim(t *testing.T, st Store, limit int, now time.Time) []outbox.Message {
	t.Helper()
	msgs, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: limit, Owner: "p1", Now: now})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return msgs
}

// Run starts a processor over st and returns a function that stops it and
// waits for Run to return.
func Run(t *testing.T, st Store, pub outbox.Publisher, cfg outbox.Config) func() {
	t.Helper()
	p, err := outbox.NewProcessor(st, pub, cfg)
	if err != nil {
		t.Fatalf("NewProcessor: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return 30 s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// FastConfig is a processor configuration for tests: short intervals, 4
// attempts, a 20 ms backoff.
func FastConfig() outbox.Config {
	return outbox.Config{
		PollInterval:      20 * time.Millisecond,
		ProcessingTimeout: time.Minute,
		RecoveryInterval:  time.Minute,
		DrainTimeout:      5 * time.Second,
		MaxAttempts:       4, // max-retries 3
		Backoff:           outbox.Backoff{Schedule: []time.Duration{20 * time.Millisecond}},
	}
}

// WaitFor waits up to timeout for cond, or fails the test.
func WaitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Item is the JSON item the tests insert: its group and its number in
// the group.
type Item struct {
	Group string `json:"group"`
	N     int    `json:"n"`
}

// CheckFIFO asserts every inserted item was stored exactly once and, per
// group, in insertion order.
func CheckFIFO(t *testing.T, stored []json.RawMessage, want map[string]int) {
	t.Helper()
	next := map[string]int{}
	seen := map[string]bool{}
	for _, raw := range stored {
		var it Item
		if err := json.Unmarshal(raw, &it); err != nil {
			t.Fatalf("stored item %s: %v", raw, err)
		}
		key := fmt.Sprint(it.Group, "/", it.N)
		if seen[key] {
			t.Errorf("item %s stored twice", key)
		}
		seen[key] = true
		if it.Group != "" {
			if it.N != next[it.Group] {
				t.Errorf("group %s: item %d stored after item %d: FIFO broken", it.Group, it.N, next[it.Group]-1)
			}
			next[it.Group] = it.N + 1
		}
	}
	total := 0
	for _, n := range want {
		total += n
	}
	if len(seen) != total {
		t.Errorf("stored %d distinct items, want %d", len(seen), total)
	}
}
