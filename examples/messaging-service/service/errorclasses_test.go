package service_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/whatsapp"
)

// seedClass is each WhatsApp error code's class in the seeds: seed 002's
// table (Retryable and Rate Limit columns), which agrees with seed 000's and
// seed 001's lists of non-retryable codes; seed 001 retries every code it
// does not list.
var seedClass = map[int]string{
	0: "retryable", 1: "retryable", 2: "permanent", 3: "rate limit", 4: "retryable", 5: "permanent", 100: "permanent",
	130: "rate limit", 131000: "permanent", 131005: "retryable", 131008: "permanent", 131009: "permanent",
	131016: "retryable", 131021: "permanent", 131026: "retryable", 131031: "permanent", 131042: "permanent",
	131045: "permanent", 131047: "permanent", 131051: "permanent", 131052: "permanent", 131053: "permanent",
	132000: "retryable", 132001: "retryable", 132005: "retryable", 132007: "permanent", 132012: "permanent",
	132015: "permanent", 132016: "permanent", 132068: "permanent", 132069: "rate limit", 133000: "permanent",
	133004: "permanent", 133005: "permanent", 133006: "permanent", 133008: "permanent", 133009: "permanent",
	133010: "permanent", 133015: "permanent", 133016: "permanent", 135000: "permanent", 190: "retryable",
	200: "permanent", 368: "retryable", 470: "permanent", 471: "rate limit", 80007: "rate limit",
}

// TestErrorClassTable: the README's table lists exactly the codes whose
// class here (the whatsapp package's default map, after Meta's current
// reference) differs from the seeds', with both classes.
func TestErrorClassTable(t *testing.T) {
	t.Parallel()
	m := whatsapp.DefaultErrorMap()
	codes := slices.Concat(m.Codes())
	for c := range seedClass {
		if !slices.Contains(codes, c) {
			codes = append(codes, c)
		}
	}
	slices.Sort(codes)
	want := map[int][2]string{}
	var rows []string
	for _, c := range codes {
		seed, named := seedClass[c]
		if !named {
			seed = "retryable" // seed 001: every other code
		}
		here := m.Classify(c, "").Class()
		if here == seed {
			continue
		}
		want[c] = [2]string{seed, here}
		src := "002"
		if !named {
			src = "001 (not named: retried)"
		}
		rows = append(rows, fmt.Sprintf("| %d | %s | %s | %s | %s |", c, seed, src, here, m.Classify(c, "").Description))
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| (\d+) \| (retryable|permanent|rate limit|paused) \| [^|]+ \| (retryable|permanent|rate limit|paused) \|`)
	got := map[int][2]string{}
	for _, r := range row.FindAllStringSubmatch(string(readme), -1) {
		c, _ := strconv.Atoi(r[1])
		got[c] = [2]string{r[2], r[3]}
	}
	for c, w := range want {
		if got[c] != w {
			t.Errorf("README: code %d is %s in the seeds and %s here; its row says %v", c, w[0], w[1], got[c])
		}
	}
	for c := range got {
		if _, ok := want[c]; !ok {
			t.Errorf("README: code %d has a row but its class is the seeds'", c)
		}
	}
	if t.Failed() {
		t.Logf("the rows:\n%s", strings.Join(rows, "\n"))
	}
}
