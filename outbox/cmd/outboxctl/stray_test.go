package main

import (
	"context"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestEveryCommandRefusesStrayWords: a word a command does not understand,
// before or after its flags, is bad usage (exit 2) and nothing changes: a
// stray word before --dry-run does not turn a dry run into a real requeue,
// one before --topic does not widen a listing. One row per command at
// least, over every command.
func TestEveryCommandRefusesStrayWords(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "stray.db")
	url := "sqlite://" + path
	mustCtl(t, "migrate", "up", "--url", url)
	b := backend{kind: "sqlite", args: []string{"--url", url}}
	tg := openStore(t, b)
	ids := seed(t, tg.store, "emails/FAILED", "emails/FAILED", "emails/SENT", "sms/PENDING")
	before := counts(t, tg.store)
	id := ids["emails/FAILED"]

	for _, args := range [][]string{
		{"requeue", "--url", url, "--topic", "emails", "stray", "--dry-run"},
		{"requeue", "--url", url, "--topic", "emails", "--dry-run", "stray"},
		{"requeue", "stray", "--url", url, "--all"},
		{"requeue", "--url", url, "--id", id, "stray"},
		{"requeue", "--url", url, "--all", "--", "--dry-run"},
		{"list", "--url", url, "--status", "FAILED", "foo", "--topic", "emails"},
		{"list", "--url", url, "--json", "foo"},
		{"show", id, "extra", "--url", url},
		{"show", "--url", url, id, id},
		{"stats", "--url", url, "stray"},
		{"stats", "stray", "--url", url, "--watch", "--times", "1"},
		{"stats", "--url", url, "--times", "2"}, // --times without --watch
		{"cancel", "--url", url, "--status", "FAILED", "--all", "stray", "--yes"},
		{"cancel", "--url", url, "--id", id, "--yes", "stray"},
		{"prune", "--url", url, "--older-than", "1ns", "stray"},
		{"prune", "stray", "--url", url, "--older-than", "1ns", "--status", "FAILED"},
		{"pause", "--url", url, "--topic", "emails", "stray"},
		{"pause", "stray", "--url", url},
		{"resume", "--url", url, "--topic", "sms", "stray"},
		{"storage", "--url", url, "stray"},
		{"migrate", "up", "stray", "--url", url},
		{"migrate", "up", "down", "--url", url},
		{"migrate", "down", "--url", url, "stray", "--to", "0", "--yes"},
		{"migrate", "down", "--url", url, "--to", "0", "--yes", "stray"},
		{"migrate", "status", "--url", url, "stray"},
		{"migrate", "sql", "--url", url, "stray"},
		{"migrate", "--url", url},
		// A flag that does not apply to the action is refused too.
		{"migrate", "status", "--url", url, "--to", "1"},
		{"migrate", "sql", "--url", url, "--yes"},
		{"migrate", "up", "--url", url, "--down"},
	} {
		code, out, errOut := ctl(t, args...)
		if code != 2 || errOut == "" {
			t.Errorf("outboxctl %v: exit %d, stdout %q, stderr %q; want exit 2 with a message", args, code, out, errOut)
		}
		if strings.Contains(out, "requeued") || strings.Contains(out, "pruned") || strings.Contains(out, "cancelled") {
			t.Errorf("outboxctl %v acted: %s", args, out)
		}
	}
	if after := counts(t, tg.store); !maps.Equal(after, before) {
		t.Fatalf("refused commands changed the store: %v, was %v", after, before)
	}
	if ps, _ := tg.store.(outbox.Admin).PauseList(context.Background(), outbox.PauseListParams{}); len(ps) != 0 {
		t.Fatalf("a refused pause paused: %v", ps)
	}
	if v, err := tg.migrator.SchemaVersion(context.Background()); err != nil || v != tg.migrations[len(tg.migrations)-1].Version {
		t.Fatalf("schema version after refused migrations: %d, %v", v, err)
	}
	// The words are read, not skipped: the same lines without the stray
	// word work, and a positional ID in any place.
	if out := mustCtl(t, "show", id, "--url", url); !strings.Contains(out, id) {
		t.Fatalf("show ID --url: %s", out)
	}
	if out := mustCtl(t, "migrate", "--url", url, "status"); !strings.Contains(out, "applied") {
		t.Fatalf("migrate --url URL status: %s", out)
	}
}
