package testbackend_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/internal/testbackend"
)

// TestLookupOrStartSaysWhatItTried: with no variable, no local server and
// no container to be had, the reason names all three.
func TestLookupOrStartSaysWhatItTried(t *testing.T) {
	t.Parallel()
	c := testbackend.Container{
		Image: "outboxkit.invalid/no-such-image:0", Port: "1/tcp",
		Value: func(hp string) string { return hp },
	}
	v, why := testbackend.LookupOrStart("OUTBOXKIT_TEST_NEVER_SET", "x", "127.0.0.1:1", c)
	t.Log(why)
	require.Empty(t, v)
	require.Contains(t, why, "OUTBOXKIT_TEST_NEVER_SET is not set")
	require.Contains(t, why, "nothing answers on 127.0.0.1:1")
	require.Contains(t, why, "outboxkit.invalid/no-such-image:0")
}
