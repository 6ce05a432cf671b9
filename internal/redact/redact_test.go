package redact_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/internal/redact"
)

func TestSecrets(t *testing.T) {
	t.Parallel()
	got := redact.Secrets("token=abcd1234 and abcd1234 again; x=ab", "abcd1234", "ab", "")
	require.Equal(t, "token=[redacted] and [redacted] again; x=ab", got, "secrets of 4+ bytes are replaced, shorter ones kept")
	b := []byte("Bearer s3cr3t")
	require.Equal(t, "Bearer [redacted]", string(redact.SecretsBytes(b, "s3cr3t")))
	require.Equal(t, "no secret", string(redact.SecretsBytes([]byte("no secret"), "s3cr3t")))
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	require.Equal(t, "a b", redact.Printable("\n a\x00b \t", 10))
	require.Equal(t, "bad ? byte", redact.Printable("bad \xff byte", 20))
	cut := redact.Printable(strings.Repeat("é", 10), 5)
	require.True(t, utf8.ValidString(cut), "cut on a rune boundary: %q", cut)
	require.Equal(t, "éé…", cut)
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
		require.Equal(t, c.want, redact.RetryAfter(c.in, now, time.Hour), "RetryAfter(%q)", c.in)
	}
}

func FuzzRetryAfter(f *testing.F) {
	f.Add("120")
	f.Add("Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add("-5")
	f.Add("99999999999999999999")
	now := time.Date(2015, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := redact.RetryAfter(v, now, 24*time.Hour); d < 0 || d > 24*time.Hour {
			t.Fatalf("RetryAfter(%q) = %s", v, d)
		}
	})
}
