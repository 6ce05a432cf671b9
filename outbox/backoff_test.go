package outbox

import (
	"testing"
	"time"
)

// TestBackoffSeedTimeline replays the seed's timeline: attempt 1 at T+0,
// then 1, 5, 15, 60 and 360 minutes later, then the message is dead.
func TestBackoffSeedTimeline(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wantAttemptAt := []time.Duration{0, 1 * time.Minute, 6 * time.Minute, 21 * time.Minute, 81 * time.Minute, 441 * time.Minute}
	var b Backoff
	now := t0
	for attempt := 1; ; attempt++ {
		if attempt > len(wantAttemptAt) {
			t.Fatalf("attempt %d happened; the seed dead-letters after %d", attempt, len(wantAttemptAt))
		}
		if got := now.Sub(t0); got != wantAttemptAt[attempt-1] {
			t.Fatalf("attempt %d at T+%s, want T+%s", attempt, got, wantAttemptAt[attempt-1])
		}
		next, retry := b.Next(now, attempt, DefaultMaxAttempts, false, 0)
		if !retry {
			if attempt != 6 {
				t.Fatalf("dead-lettered after attempt %d, want 6", attempt)
			}
			break
		}
		now = next
	}
}

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := Backoff{Schedule: []time.Duration{time.Second, 2 * time.Second}}
	cases := []struct {
		attempt    int
		retryAfter time.Duration
		want       time.Duration
	}{
		{0, 0, time.Second},
		{1, 0, time.Second},
		{2, 0, 2 * time.Second},
		{9, 0, 2 * time.Second}, // past the end: the last entry
		{1, 42 * time.Second, 42 * time.Second},
	}
	for _, c := range cases {
		if got := b.Delay(c.attempt, c.retryAfter); got != c.want {
			t.Errorf("Delay(%d, %s) = %s, want %s", c.attempt, c.retryAfter, got, c.want)
		}
	}
	if _, retry := b.Next(time.Now(), 1, 5, true, 0); retry {
		t.Error("a permanent error must not be retried")
	}
	if _, retry := b.Next(time.Now(), 5, 5, false, 0); retry {
		t.Error("attempts exhausted must not be retried")
	}
}

func TestBackoffJitterBounds(t *testing.T) {
	t.Parallel()
	b := Backoff{Schedule: []time.Duration{time.Minute}, Jitter: 0.2}
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := b.Delay(1, 0)
		if d < 48*time.Second || d > 72*time.Second {
			t.Fatalf("jittered delay %s outside [48s, 72s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("jitter produced only %d distinct delays", len(seen))
	}
}
