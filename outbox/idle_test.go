package outbox

import (
	"testing"
	"time"
)

// TestDueTimes: the due times come back in order, those past dropped, and
// at most maxDues are kept (the earliest).
func TestDueTimes(t *testing.T) {
	t.Parallel()
	var d dueTimes
	t0 := time.Unix(1000, 0)
	for i := maxDues + 10; i > 0; i-- {
		d.add(t0.Add(time.Duration(i) * time.Second))
	}
	if len(d.at) != maxDues {
		t.Fatalf("%d due times kept, want %d", len(d.at), maxDues)
	}
	if at, ok := d.next(t0); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("next: %v %v, want the earliest", at, ok)
	}
	if at, ok := d.next(t0.Add(3 * time.Second)); !ok || !at.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("next after 3 s: %v %v, want 4 s", at, ok)
	}
	if _, ok := d.next(t0.Add(maxDues * time.Second)); ok {
		t.Fatal("a due time kept past the latest kept")
	}
}

// TestIdlePollIntervalValidated: IdlePollInterval defaults to
// PollInterval and may not be shorter.
func TestIdlePollIntervalValidated(t *testing.T) {
	t.Parallel()
	c := Config{ID: "p", AllTopics: true, PollInterval: 2 * time.Second}.WithDefaults()
	if c.IdlePollInterval != 2*time.Second {
		t.Fatalf("IdlePollInterval defaults to %s, want PollInterval", c.IdlePollInterval)
	}
	c.IdlePollInterval = time.Second
	if err := c.Validate(); err == nil {
		t.Fatal("an IdlePollInterval shorter than PollInterval is accepted")
	}
}
