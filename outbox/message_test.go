package outbox

import (
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

func TestValidateMessage(t *testing.T) {
	t.Parallel()
	ok := func() Message { return Message{Topic: "t", Payload: []byte(`{"a":1}`)} }
	cases := []struct {
		field string
		edit  func(*Message)
	}{
		{"Topic", func(m *Message) { m.Topic = "" }},
		{"Topic", func(m *Message) { m.Topic = strings.Repeat("x", 256) }},
		{"Tenant", func(m *Message) { m.Tenant = "a\x00b" }},
		{"Group", func(m *Message) { m.Group = "\xff" }},
		{"IdempotencyKey", func(m *Message) { m.IdempotencyKey = strings.Repeat("k", 300) }},
		{"Payload", func(m *Message) { m.Payload = nil }},
		{"Payload", func(m *Message) { m.Payload = []byte(`{"a":`) }},
		{"Payload", func(m *Message) { m.Payload = []byte(`"` + strings.Repeat("a", MaxPayloadBytes) + `"`) }},
		{"Headers", func(m *Message) { m.Headers = map[string]string{"": "x"} }},
		{"MaxAttempts", func(m *Message) { m.MaxAttempts = -1 }},
		{"Topic", func(m *Message) { m.Topic = "  " }},
		{"Tenant", func(m *Message) { m.Tenant = " " }},
		{"Tenant", func(m *Message) { m.Tenant = "acme " }},
		{"ID", func(m *Message) { m.ID = "order-42" }},
		{"ID", func(m *Message) { m.ID = "01hzzzzzzzzzzzzzzzzzzzzzzz" }}, // lower case sorts apart
		{"ID", func(m *Message) { m.ID = "81HZZZZZZZZZZZZZZZZZZZZZZZ" }}, // more than 128 bits
		{"ID", func(m *Message) { m.ID = "01HZZZZZZZZZZZZZZZZZZZZZZU" }}, // U is not Crockford
	}
	for _, c := range cases {
		m := ok()
		c.edit(&m)
		err := ValidateMessage(&m)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !errors.Is(err, ErrInvalidInput) {
			t.Errorf("want invalid %s, got %v", c.field, err)
		}
	}
	m := ok()
	if err := ValidateMessage(&m); err != nil {
		t.Fatalf("valid message refused: %v", err)
	}
	m.ID, m.Tenant = NewID(time.Now()), "acme"
	if err := ValidateMessage(&m); err != nil {
		t.Fatalf("a message with its own ULID refused: %v", err)
	}
}

func TestPrepareMessage(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("x", 3600))
	m := Message{Topic: "t", Payload: []byte(`1`), Status: StatusSent, Attempts: 3}
	if err := prepareMessage(&m, now, DefaultMaxPayloadBytes); err != nil {
		t.Fatal(err)
	}
	if len(m.ID) != 26 || m.IdempotencyKey != m.ID || m.Status != StatusPending || m.Attempts != 0 {
		t.Fatalf("prepared: %+v", m)
	}
	if !m.CreatedAt.Equal(now) || m.CreatedAt.Location() != time.UTC || !m.NextAttemptAt.Equal(now) {
		t.Fatalf("times: %+v", m)
	}
	later := now.Add(time.Hour)
	m2 := Message{Topic: "t", Payload: []byte(`1`), NextAttemptAt: later, IdempotencyKey: "k"}
	_ = prepareMessage(&m2, now, DefaultMaxPayloadBytes)
	if !m2.NextAttemptAt.Equal(later) || m2.IdempotencyKey != "k" {
		t.Fatalf("a caller's delay and key must be kept: %+v", m2)
	}
}

// TestIDGenerated: a message reports a generated ID only when its
// preparation generated it, and no longer once the ID is changed, the
// message is prepared again (it has an ID then), or it is forgotten.
func TestIDGenerated(t *testing.T) {
	t.Parallel()
	now := time.Now()
	m := Message{Topic: "t", Payload: []byte(`1`)}
	if m.IDGenerated() {
		t.Fatal("an unprepared message reports a generated ID")
	}
	if err := prepareMessage(&m, now, DefaultMaxPayloadBytes); err != nil || !m.IDGenerated() {
		t.Fatalf("a prepared keyless message without ID: IDGenerated false (err %v)", err)
	}
	again := m
	if err := prepareMessage(&again, now, DefaultMaxPayloadBytes); err != nil || again.IDGenerated() {
		t.Fatalf("prepared again with its ID: IDGenerated true (err %v)", err)
	}
	changed := m
	changed.ID = NewID(now)
	if changed.IDGenerated() {
		t.Fatal("an ID changed after preparation is reported as generated")
	}
	chosen := Message{Topic: "t", Payload: []byte(`1`), ID: NewID(now)}
	if err := prepareMessage(&chosen, now, DefaultMaxPayloadBytes); err != nil || chosen.IDGenerated() {
		t.Fatalf("a caller-chosen ID is reported as generated (err %v)", err)
	}
	m.ForgetGeneratedID()
	if m.IDGenerated() {
		t.Fatal("ForgetGeneratedID left IDGenerated true")
	}
}

func TestNewIDSortsAndIsUnique(t *testing.T) {
	t.Parallel()
	now := time.Now()
	const n = 4000
	var mu sync.Mutex
	ids := make([]string, 0, n)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/4; i++ {
				id := NewID(now)
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range ids {
		if len(id) != 26 || strings.Trim(id, crockford) != "" {
			t.Fatalf("bad ULID %q", id)
		}
		if seen[id] {
			t.Fatalf("duplicate ID %s", id)
		}
		seen[id] = true
	}
	a, b := NewID(now), NewID(now.Add(time.Millisecond))
	if !(a < b) {
		t.Fatalf("IDs must sort by time: %s !< %s", a, b)
	}
	// IDs from one goroutine in one millisecond are increasing
	seq := []string{NewID(now), NewID(now), NewID(now)}
	if !sort.StringsAreSorted(seq) {
		t.Fatalf("not monotonic: %v", seq)
	}
	// The time part is the millisecond given, or the last one used when
	// the clock stepped back (ulid.Parse reads it back), and a clock
	// stepping back still yields increasing IDs.
	at := time.Now()
	id := NewID(at)
	u, err := ulid.Parse(id)
	if err != nil || ulid.Time(u.Time()).UnixMilli() < at.UnixMilli() {
		t.Fatalf("NewID(%v) = %s, parsed %v (%v)", at, id, u, err)
	}
	if back := NewID(at.Add(-time.Hour)); back <= id {
		t.Fatalf("after a clock step back: %s <= %s", back, id)
	}
}
