// Package httpx holds what the HTTP publishers (transport/http,
// flowcatalyst, whatsapp) share about a request's outcome: whether an
// error is a timeout and how long a Retry-After header asks to wait.
package httpx

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// IsTimeout reports whether err, or an error it wraps, says it is a
// timeout (has a Timeout method that returns true, as net.Error and
// url.Error do).
func IsTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// RetryAfter reads a Retry-After header value (delay seconds or an HTTP
// date, relative to now), capped at limit. 0 means absent, unreadable or
// already past: the caller's backoff applies.
func RetryAfter(v string, now time.Time, limit time.Duration) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(limit/time.Second) {
			return limit
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), limit)
	}
	return 0
}
