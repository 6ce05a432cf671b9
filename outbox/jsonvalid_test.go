package outbox

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// referenceJSON is what validJSON must report.
func referenceJSON(b []byte) bool { return utf8.Valid(b) && json.Valid(b) }

var jsonCases = []string{
	``, ` `, `null`, `true`, `false`, `nul`, `nulll`, `tru`, `True`, `0`, `-0`, `01`, `-01`, `1.`, `.1`, `1.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`,
	`-`, `--1`, `+1`, `1.5e3.2`, `123456789012345678901234567890`, `0.0000`, `-0.0e-0`, `1 2`, ` 1 `, "\t\n\r 1\r\n",
	`""`, `"abc"`, `"a\"b"`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`, `"\x"`, `"\'"`, `"abc`, `"\`,
	"\"a\x01b\"", "\"a\x7fb\"", "\"\t\"", `"é"`, "\"\xff\"", "\"\xc3\"", "\"\xc3\xa9\"", "\"\xed\xa0\x80\"", "\"\xef\xbf\xbd\"", "\"\xf4\x90\x80\x80\"",
	"\xef\xbb\xbf{}", `"\ud800"`, `"\udc00\ud800"`,
	`{}`, `[]`, `{ }`, `[ ]`, `[1,]`, `[,1]`, `[1 2]`, `[1,2]`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{"a":}`, `{a:1}`, `{"a":1 "b":2}`, `{"a":[1,{"b":null}],"c":"d"}`,
	`{"a":1}}`, `[[]`, `[]]`, `{"a":{"b":{"c":[true,false,null,-1.5e10,"x"]}}}`, `[{}]`, `[{},{}]`, `{"":""}`, `{"a":1,"a":2}`, `[1,[2,[3,[4]]]]`,
	` { "a" : [ 1 , 2 ] } `, `{"a"` + "\n" + `:1}`, `[` + "\x00" + `]`, "[1]\x00", `{"a":1}x`, `{,}`, `{"a":1,,"b":2}`, `[-]`, `[1e]`, `[01]`,
}

func TestValidJSONAgreesWithTheStandardLibrary(t *testing.T) {
	for _, c := range jsonCases {
		if got, want := validJSON([]byte(c)), referenceJSON([]byte(c)); got != want {
			t.Errorf("validJSON(%q) = %v, want %v", c, got, want)
		}
	}
}

func TestValidJSONNestingLimit(t *testing.T) {
	for _, n := range []int{1, 31, 32, 33, 9999, 10000, 10001, 20000} {
		for _, doc := range []string{
			strings.Repeat("[", n) + strings.Repeat("]", n),
			strings.Repeat(`{"a":`, n-1) + "{}" + strings.Repeat("}", n-1),
			strings.Repeat(`[{"a":`, n/2) + "1" + strings.Repeat("}]", n/2),
		} {
			if got, want := validJSON([]byte(doc)), referenceJSON([]byte(doc)); got != want {
				t.Errorf("depth %d (%.20s...): validJSON = %v, want %v", n, doc, got, want)
			}
		}
	}
	// The limit itself, as encoding/json has it.
	if !validJSON([]byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000))) {
		t.Error("10,000 nested arrays refused")
	}
	if validJSON([]byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))) {
		t.Error("10,001 nested arrays accepted")
	}
}

// TestValidJSONOnMutatedDocuments compares validJSON with the reference on
// documents damaged at random: a byte changed, removed, inserted or
// duplicated, or the document cut short.
func TestValidJSONOnMutatedDocuments(t *testing.T) {
	seeds := []string{
		`{"n":12,"type":"order.updated","data":{"customer":"c-000012","currency":"EUR","amount":-12.50e2,"ok":true,"none":null,"tags":["a","b\n","\u00e9","é"]}}`,
		`[1,-0.5,2e10,{"a":[[],{}]},"x\"y\\z",false]`,
		`"just a string with \t escapes and ünïcödé ✓ 😀"`,
	}
	alphabet := []byte("{}[]:,\"\\ \t\n0123456789-+.eEtrufalsn\x00\x1f\x7f\x80\xbf\xc3\xe2\xf0\xffu")
	rng := rand.New(rand.NewPCG(1, 2))
	iterations := 200_000
	if testing.Short() {
		iterations = 20_000
	}
	for it := range iterations {
		b := []byte(seeds[it%len(seeds)])
		for range 1 + rng.IntN(3) {
			if len(b) == 0 {
				break
			}
			p := rng.IntN(len(b))
			switch rng.IntN(5) {
			case 0:
				b[p] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				b = append(b[:p], b[p+1:]...)
			case 2:
				b = append(b[:p], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[p:]...)...)
			case 3:
				b = append(b[:p], append([]byte{b[p]}, b[p:]...)...)
			case 4:
				b = b[:p]
			}
		}
		if got, want := validJSON(b), referenceJSON(b); got != want {
			t.Fatalf("validJSON(%q) = %v, want %v", b, got, want)
		}
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), referenceJSON(b); got != want {
			t.Fatalf("validJSON(%q) = %v, want %v", b, got, want)
		}
	})
}

var benchJSONPayload = []byte(`{"n":12,"type":"order.updated","data":{"customer":"c-000012","currency":"EUR","note":"000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"}}`)

func BenchmarkValidJSON(b *testing.B) {
	b.SetBytes(int64(len(benchJSONPayload)))
	for b.Loop() {
		if !validJSON(benchJSONPayload) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkValidJSONReference(b *testing.B) {
	b.SetBytes(int64(len(benchJSONPayload)))
	for b.Loop() {
		if !referenceJSON(benchJSONPayload) {
			b.Fatal("invalid")
		}
	}
}
