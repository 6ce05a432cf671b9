package sqlstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
)

// TestTimeScan: one scanner reads every way the two databases hand a time
// back, as the same UTC instant.
func TestTimeScan(t *testing.T) {
	t.Parallel()
	want := time.Date(2026, 3, 29, 1, 30, 0, 123456000, time.UTC)
	for name, v := range map[string]any{
		"sqlite integer micros":      want.UnixMicro(),
		"mysql text":                 "2026-03-29 01:30:00.123456",
		"mysql bytes":                []byte("2026-03-29 01:30:00.123456"),
		"mysql parseTime in a loc":   time.Date(2026, 3, 29, 1, 30, 0, 123456000, time.FixedZone("UTC+5", 5*3600)),
		"mysql parseTime in UTC now": want,
	} {
		var got sqlstore.Time
		require.NoError(t, got.Scan(v), name)
		require.True(t, got.Valid, name)
		require.True(t, got.T.Equal(want), "%s: %v", name, got.T)
	}
	for name, v := range map[string]any{"NULL": nil, "empty": "", "mysql zero date": "0000-00-00 00:00:00"} {
		got := sqlstore.Time{T: want, Valid: true}
		require.NoError(t, got.Scan(v), name)
		require.False(t, got.Valid, name)
		require.True(t, got.T.IsZero(), name)
	}
	var bad sqlstore.Time
	require.Error(t, bad.Scan("yesterday"))
	require.Error(t, bad.Scan(1.5))
}

// TestStatements: a migration file splits at the semicolons that end a
// line; comment lines go.
func TestStatements(t *testing.T) {
	t.Parallel()
	got := sqlstore.Statements("-- header\nCREATE TABLE a (x INT);\n\n-- note\nCREATE INDEX i\n  ON a (x);\nDROP TABLE b")
	require.Equal(t, []string{"CREATE TABLE a (x INT)", "CREATE INDEX i\n  ON a (x)", "DROP TABLE b"}, got)
}
