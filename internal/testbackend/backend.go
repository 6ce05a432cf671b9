// Package testbackend finds the real servers the tests talk to.
//
// Each backend is found, in order, through its OUTBOXKIT_*_DSN/URL/ADDR
// environment variable, else the server on its default local port if one
// answers, else a container started with testcontainers-go (Docker; see
// Container). When none works the test is skipped with a message naming the
// backend and what was tried, except when OUTBOXKIT_REQUIRE_BACKENDS=1 (set
// by .ci/run), where the test fails. The package is imported by tests only,
// so no store's build compiles testcontainers-go.
package testbackend

import (
	"net"
	"os"
	"testing"
	"time"
)

// Required reports whether missing backends fail the run
// (OUTBOXKIT_REQUIRE_BACKENDS=1).
func Required() bool { return os.Getenv("OUTBOXKIT_REQUIRE_BACKENDS") == "1" }

// Unavailable skips t (or fails it when backends are required) because
// backend could not be reached.
func Unavailable(t testing.TB, backend, why string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is required (OUTBOXKIT_REQUIRE_BACKENDS=1) but unavailable: %s", backend, why)
	}
	t.Skipf("%s unavailable, skipping: %s", backend, why)
}

// Answers reports whether a TCP server listens on addr.
func Answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// Lookup returns the value of env if set, else def if its host:port
// (defAddr) answers, else "" and a reason.
func Lookup(env, def, defAddr string) (string, string) {
	if v := os.Getenv(env); v != "" {
		return v, ""
	}
	if Answers(defAddr) {
		return def, ""
	}
	return "", env + " is not set and nothing answers on " + defAddr
}
