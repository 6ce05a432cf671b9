package flowcatalyst_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
)

func TestTSIDString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id   flowcatalyst.TSID
		want string
	}{
		{0, "0000000000000"},
		{1, "0000000000001"},
		{31, "000000000000Z"},
		{32, "0000000000010"},
		{1<<64 - 1, "FZZZZZZZZZZZZ"},
		{1 << 63, "8000000000000"},
		// 2026-01-01T00:00:00Z, counter 5, random 7.
		{flowcatalyst.TSID(uint64(1767225600000)<<22 | 5<<10 | 7), "6DQDPN8000507"},
	}
	for _, tt := range tests {
		if got := tt.id.String(); got != tt.want {
			t.Errorf("TSID(%d).String() = %s, want %s", uint64(tt.id), got, tt.want)
		}
		back, err := flowcatalyst.ParseTSID(tt.want)
		if err != nil || back != tt.id {
			t.Errorf("ParseTSID(%s) = %d, %v; want %d", tt.want, uint64(back), err, uint64(tt.id))
		}
	}
	id := flowcatalyst.TSID(uint64(1767225600000)<<22 | 5<<10 | 7)
	if !id.Time().Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) || id.Counter() != 5 || id.Random() != 7 {
		t.Errorf("fields of %s: %s %d %d", id, id.Time(), id.Counter(), id.Random())
	}
}

func TestParseTSID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in string
		ok bool
	}{
		{"0HZXEQ5Y8JY5Z", true},
		{"0hzxeq5y8jy5z", true},
		{"FZZZZZZZZZZZZ", true},
		{"GZZZZZZZZZZZZ", false}, // 65 bits
		{"0HZXEQ5Y8JY5", false},
		{"0HZXEQ5Y8JY5ZZ", false},
		{"", false},
		{"0HZXEQ5Y8JYIL", false}, // I and L are not Crockford digits here
		{"0HZXEQ5Y8JYU0", false},
		{"0HZXEQ5Y8JY-Z", false},
		{"0HZXEQ5Y8JY5\x00", false},
		{"clt_0HZXEQ5Y8", false},
	}
	for _, tt := range tests {
		_, err := flowcatalyst.ParseTSID(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseTSID(%q) err = %v, want ok=%v", tt.in, err, tt.ok)
		}
		if err != nil && !errors.Is(err, flowcatalyst.ErrInvalidTSID) {
			t.Errorf("ParseTSID(%q) err = %v, does not match ErrInvalidTSID", tt.in, err)
		}
	}
}

func TestTSIDTextRoundTrip(t *testing.T) {
	t.Parallel()
	for range 1000 {
		id := flowcatalyst.NewTSID()
		b, _ := id.MarshalText()
		var back flowcatalyst.TSID
		if err := back.UnmarshalText(b); err != nil || back != id || len(b) != flowcatalyst.TSIDLen {
			t.Fatalf("round trip of %s: %s, %v", id, back, err)
		}
	}
	var bad flowcatalyst.TSID
	if err := bad.UnmarshalText([]byte("nope")); err == nil {
		t.Fatal("UnmarshalText accepted nope")
	}
}

func TestTSIDGeneratorMonotonic(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	g := flowcatalyst.NewTSIDGenerator(clock)
	start := clock.Now()
	var ids []flowcatalyst.TSID
	// 10,000 ids in one millisecond overflow the 12-bit counter: the
	// generator borrows the next milliseconds rather than repeat.
	for range 10000 {
		ids = append(ids, g.New())
	}
	// The clock steps backwards: ids still increase.
	clock.Advance(-time.Hour)
	for range 100 {
		ids = append(ids, g.New())
	}
	clock.Advance(2 * time.Hour)
	ids = append(ids, g.New())
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] || ids[i].String() <= ids[i-1].String() {
			t.Fatalf("id %d (%s) does not follow %s", i, ids[i], ids[i-1])
		}
	}
	// Each millisecond holds at most 4,096 ids (fewer: the counter starts
	// at a random value), so 10,000 ids borrow at least 2 more.
	if d := ids[9999].Time().Sub(start); d < 2*time.Millisecond || d > 100*time.Millisecond {
		t.Errorf("after 10,000 ids in one ms the time moved %s, want at least 2 ms borrowed", d)
	}
	if got := ids[len(ids)-1].Time(); !got.Equal(start.Add(time.Hour)) {
		t.Errorf("last id time %s, want %s", got, start.Add(time.Hour))
	}
}

func TestNewTSIDConcurrent(t *testing.T) {
	t.Parallel()
	const workers, per = 8, 5000
	results := make([][]flowcatalyst.TSID, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]flowcatalyst.TSID, per)
			for i := range ids {
				ids[i] = flowcatalyst.NewTSID()
			}
			results[w] = ids
		}()
	}
	wg.Wait()
	seen := make(map[flowcatalyst.TSID]bool, workers*per)
	for _, ids := range results {
		if !slices.IsSorted(ids) {
			t.Error("one goroutine's ids are not increasing")
		}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("duplicate %s", id)
			}
			seen[id] = true
		}
	}
	now := time.Now()
	if d := now.Sub(results[0][0].Time()); d < 0 || d > time.Minute {
		t.Errorf("id time %s is not now (%s)", results[0][0].Time(), now)
	}
}
