package httpx_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/internal/httpx"
)

func TestIsTimeout(t *testing.T) {
	t.Parallel()
	timeout := &net.OpError{Op: "read", Err: &net.DNSError{IsTimeout: true}}
	require.True(t, httpx.IsTimeout(timeout))
	require.True(t, httpx.IsTimeout(&url.Error{Op: "Post", URL: "http://x", Err: timeout}), "a url.Error says what it wraps")
	require.True(t, httpx.IsTimeout(fmt.Errorf("send: %w", context.DeadlineExceeded)), "context.DeadlineExceeded is a timeout")
	require.False(t, httpx.IsTimeout(errors.New("connection refused")))
	require.False(t, httpx.IsTimeout(&net.OpError{Op: "dial", Err: errors.New("refused")}))
	require.False(t, httpx.IsTimeout(nil))
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2015, 10, 21, 7, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0}, {"120", 2 * time.Minute}, {" 7 ", 7 * time.Second}, {"0", 0}, {"-5", 0},
		{"99999999999999999999", 0}, {"100000", time.Hour}, {"soon", 0},
		{"Wed, 21 Oct 2015 07:28:00 GMT", 28 * time.Minute},
		{"Wed, 21 Oct 2015 06:28:00 GMT", 0}, // past
		{"Thu, 22 Oct 2015 07:28:00 GMT", time.Hour},
	} {
		require.Equal(t, c.want, httpx.RetryAfter(c.in, now, time.Hour), "RetryAfter(%q)", c.in)
	}
}

func FuzzRetryAfter(f *testing.F) {
	f.Add("120")
	f.Add("Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add("-5")
	f.Add("99999999999999999999")
	now := time.Date(2015, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := httpx.RetryAfter(v, now, 24*time.Hour); d < 0 || d > 24*time.Hour {
			t.Fatalf("RetryAfter(%q) = %s", v, d)
		}
	})
}
