package redact_test

import (
	"strings"
	"testing"
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
