package main

import "testing"

// TestNoteCPU: the drain's verdict on PostgreSQL's CPU reads the figure
// from the note benchDrain writes, and finds none where the server's CPU
// was not measured.
func TestNoteCPU(t *testing.T) {
	for _, c := range []struct {
		note string
		cpu  float64
		ok   bool
	}{
		{"FIFO held: yes, duplicates: 0, PostgreSQL CPU 43 µs/msg (processors' own backends 42 µs/msg), 29.1 buffer accesses", 43, true},
		{"FIFO held: yes, duplicates: 0, PostgreSQL CPU 61 µs/msg", 61, true},
		{"FIFO held: yes, duplicates: 0, 29.1 buffer accesses", 0, false},
		{"FIFO held: NO, PostgreSQL CPU n/a", 0, false},
	} {
		cpu, ok := noteCPU(c.note)
		if cpu != c.cpu || ok != c.ok {
			t.Errorf("noteCPU(%q) = %v, %v; want %v, %v", c.note, cpu, ok, c.cpu, c.ok)
		}
	}
}
