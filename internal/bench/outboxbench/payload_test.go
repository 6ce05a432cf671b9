package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestPayloadBytes: the benchmark's payloads are the documented bytes.
func TestPayloadBytes(t *testing.T) {
	for _, n := range []int{0, 1, 7, 999_999, 1_000_000, 1_234_567, 99_999_999} {
		for _, g := range []string{"group-0001", "g\"1"} {
			want := fmt.Sprintf(`{"group":%q,"n":%d,"type":"order.updated","data":{"customer":"c-%06d","amount_cents":%d,"currency":"EUR","note":"%s"}}`,
				g, n, n%1000000, n*7%100000, strings.Repeat("x", 80))
			if got := string(payload(g, n)); got != want {
				t.Fatalf("payload(%q, %d) = %s, want %s", g, n, got, want)
			}
		}
	}
}

func BenchmarkPayload(b *testing.B) {
	b.Run("appends", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			_ = payload("group-0001", i)
		}
	})
	b.Run("sprintf", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			_ = fmt.Sprintf(`{"group":%q,"n":%d,"type":"order.updated","data":{"customer":"c-%06d","amount_cents":%d,"currency":"EUR","note":"%s"}}`,
				"group-0001", i, i%1000000, i*7%100000, strings.Repeat("x", 80))
		}
	})
}
