package flowcatalyst

import (
	"testing"
)

func FuzzParseResults(f *testing.F) {
	f.Add([]byte(`{"results":[{"id":"a","status":"SUCCESS"},{"id":"b","status":"BAD_REQUEST","error":"x"}]}`), 2)
	f.Add([]byte(`{"results":[]}`), 0)
	f.Add([]byte(`{"results":null}`), 1)
	f.Add([]byte(`[]`), 0)
	f.Add([]byte(`{"results":[{"id":1}]}`), 1)
	f.Add([]byte(`{"results":[{"id":"\xff\xfe","status":"SKIPPED"}]}`), 1)
	f.Fuzz(func(t *testing.T, body []byte, n int) {
		if n < 0 || n > 2000 {
			return
		}
		results, raw, present, err := parseResults(body, n)
		if err != nil {
			return
		}
		if !present || len(results) != n || len(raw) != n {
			t.Fatalf("ok parse with present=%v, %d results, %d raw for %d items", present, len(results), len(raw), n)
		}
		for i, r := range results {
			if r.Status == "" {
				t.Fatalf("result %d has no status", i)
			}
		}
	})
}

func FuzzErrorDetail(f *testing.F) {
	f.Add([]byte(`{"error":"BATCH_TOO_LARGE","message":"at most 1000"}`))
	f.Add([]byte("<html>\x00\x1b[31m</html>"))
	f.Fuzz(func(t *testing.T, body []byte) {
		s := errorDetail(body)
		if len(s) > 600 {
			t.Fatalf("detail is %d bytes", len(s))
		}
		for _, r := range s {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("control character in %q", s)
			}
		}
	})
}

func FuzzParseTSID(f *testing.F) {
	f.Add("0HZXEQ5Y8JY5Z")
	f.Add("FZZZZZZZZZZZZ")
	f.Add("GZZZZZZZZZZZZ")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseTSID(s)
		if err != nil {
			return
		}
		back, err := ParseTSID(id.String())
		if err != nil || back != id {
			t.Fatalf("%q parsed to %d, which does not round-trip: %v", s, uint64(id), err)
		}
	})
}
