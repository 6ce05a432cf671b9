package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
)

// TestNotMigrated: every command on a database that was never migrated
// answers "not migrated (outboxctl migrate up)" with exit 3 and creates
// nothing: no SQLite file (a mistyped path), no table, no collection.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		before := b.objects()
		for _, args := range [][]string{
			{"stats"},
			{"list"},
			{"show", "01ARZ3NDEKTSV4RRFFQ69G5FAV"},
			{"requeue", "--all", "--dry-run"},
			{"cancel", "--status", "FAILED", "--all", "--dry-run"},
			{"prune", "--older-than", "1h", "--dry-run"},
			{"pause"},
			{"resume", "--topic", "t"},
			{"storage"},
			{"migrate", "status"},
			{"migrate", "down"},
		} {
			code, out, errOut := ctl(t, b.with(args...)...)
			if code != 3 || !strings.Contains(errOut, "not migrated (outboxctl migrate up)") {
				t.Errorf("%v on an unmigrated %s: exit %d, stdout %q, stderr %q; want exit 3 and \"not migrated (outboxctl migrate up)\"",
					args, b.kind, code, out, errOut)
			}
		}
		if after := b.objects(); after != before {
			t.Fatalf("the commands created something: %d objects before, %d after (-1: no SQLite file)", before, after)
		}
	})
}

// TestMigrateDown: down reverts one migration by default; it never
// reaches version 0 (every table and its data) unless told --to 0 and
// confirmed (--yes, or yes typed on a terminal); a negative --to is
// refused. migrate status exits 3 while migrations are pending.
func TestMigrateDown(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		status := func() (int, string) {
			code, out, _ := ctl(t, b.with("migrate", "status")...)
			return code, out
		}
		migs := knownMigrations(t, b)
		first, newest := migs[0], migs[len(migs)-1]
		version := func(v int) string { return fmt.Sprintf("schema version %d (newest known: %d)", v, newest.Version) }
		if out := mustCtl(t, b.with("migrate", "up", "--to", fmt.Sprint(first.Version))...); !strings.Contains(out, version(first.Version)) {
			t.Fatalf("migrate up --to %d: %s", first.Version, out)
		}
		if code, out := status(); code != 3 || !strings.Contains(out, fmt.Sprintf("%03d_%s\tpending", newest.Version, newest.Name)) {
			t.Fatalf("migrate status with migrations pending: exit %d, want 3:\n%s", code, out)
		}
		if out := mustCtl(t, b.with("migrate", "up", "--dry-run")...); !strings.Contains(out, fmt.Sprintf("would apply %03d_%s (up)", newest.Version, newest.Name)) {
			t.Fatalf("migrate up --dry-run: %s", out)
		}
		mustCtl(t, b.with("migrate", "up")...)
		if code, out := status(); code != 0 || strings.Contains(out, "pending") {
			t.Fatalf("migrate status after up: exit %d, want 0:\n%s", code, out)
		}
		migrated := b.objects()

		// One step at a time, down to the first migration.
		for i := len(migs) - 2; i >= 0; i-- {
			if out := mustCtl(t, b.with("migrate", "down")...); !strings.Contains(out, version(migs[i].Version)) {
				t.Fatalf("migrate down (one step to %d): %s", migs[i].Version, out)
			}
		}
		atOne := b.objects()
		for _, c := range []struct {
			args  []string
			input string
			term  bool
			code  int
		}{
			{[]string{"down"}, "", false, 2},                                       // one step from the first is 0: not by default
			{[]string{"down", "--to", "-1"}, "", false, 2},                         // negative
			{[]string{"down", "--to", "-5", "--yes"}, "", false, 2},                // negative, even confirmed
			{[]string{"down", "--to", "0"}, "", false, 2},                          // no --yes and no terminal to ask
			{[]string{"down", "--to", "0"}, "no\n", true, 1},                       // declined on a terminal
			{[]string{"down", "--to", "0"}, "", true, 1},                           // no answer
			{[]string{"down", "--to", fmt.Sprint(newest.Version)}, "", false, 2},   // above the schema
			{[]string{"up", "--to", fmt.Sprint(newest.Version + 1)}, "", false, 2}, // unknown version
		} {
			code, out, errOut := ctlTerminal(t, c.input, c.term, b.with(append([]string{"migrate"}, c.args...)...)...)
			if code != c.code {
				t.Errorf("migrate %v (stdin %q, terminal %v): exit %d, want %d\n%s%s", c.args, c.input, c.term, code, c.code, out, errOut)
			}
			if got := b.objects(); got != atOne {
				t.Fatalf("migrate %v changed the schema: %d objects, want %d", c.args, got, atOne)
			}
		}
		if out := mustCtl(t, b.with("migrate", "down", "--to", "0", "--dry-run")...); !strings.Contains(out, fmt.Sprintf("would revert %03d_%s (down)", first.Version, first.Name)) || b.objects() != atOne {
			t.Fatalf("migrate down --to 0 --dry-run: %s", out)
		}
		code, out, errOut := ctlTerminal(t, "yes\n", true, b.with("migrate", "down", "--to", "0")...)
		if code != 0 || !strings.Contains(out, "schema version 0") || !strings.Contains(errOut, "Type yes") {
			t.Fatalf("migrate down --to 0, confirmed on a terminal: exit %d\n%s%s", code, out, errOut)
		}
		mustCtl(t, b.with("migrate", "up")...)
		if got := b.objects(); got != migrated {
			t.Errorf("up again: %d objects, want %d", got, migrated)
		}
		if out := mustCtl(t, b.with("migrate", "down", "--to", "0", "--yes")...); !strings.Contains(out, "schema version 0") {
			t.Fatalf("migrate down --to 0 --yes: %s", out)
		}
	})
}

// TestPrune: prune keeps dead letters unless --status names FAILED,
// narrows by --topic, counts without deleting on --dry-run, and reports
// its progress on stderr.
func TestPrune(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		mustCtl(t, b.with("migrate", "up")...)
		st := openStore(t, b).store
		seed(t, st, "a/SENT", "a/FAILED", "a/CANCELLED", "b/SENT", "b/FAILED", "a/PENDING")
		want := func(what string, sent, failed, cancelled, pending int64) {
			t.Helper()
			c := counts(t, st)
			if c[outbox.StatusSent] != sent || c[outbox.StatusFailed] != failed || c[outbox.StatusCancelled] != cancelled || c[outbox.StatusPending] != pending {
				t.Fatalf("%s: %v; want SENT %d, FAILED %d, CANCELLED %d, PENDING %d", what, c, sent, failed, cancelled, pending)
			}
		}
		want("seeded", 2, 2, 1, 1)
		if out := mustCtl(t, b.with("prune", "--older-than", "1ns", "--dry-run")...); !strings.Contains(out, "would prune 3 SENT, DELIVERED, CANCELLED messages") {
			t.Fatalf("prune --dry-run: %s", out)
		}
		want("after the dry run", 2, 2, 1, 1)
		code, out, errOut := ctl(t, b.with("prune", "--older-than", "1ns", "--topic", "a")...)
		if code != 0 || !strings.Contains(out, "pruned 2 SENT, DELIVERED, CANCELLED messages of topic \"a\"") || !strings.Contains(errOut, "prune: 2 deleted so far") {
			t.Fatalf("prune --topic a: exit %d\n%s%s", code, out, errOut)
		}
		want("after prune --topic a", 1, 2, 0, 1)
		mustCtl(t, b.with("prune", "--older-than", "1ns")...)
		want("after prune (dead letters kept)", 0, 2, 0, 1)
		if out := mustCtl(t, b.with("prune", "--older-than", "1ns", "--status", "failed", "--dry-run")...); !strings.Contains(out, "would prune 2 FAILED") {
			t.Fatalf("prune --status failed --dry-run: %s", out)
		}
		mustCtl(t, b.with("prune", "--older-than", "1ns", "--status", "FAILED", "--topic", "b")...)
		want("after prune --status FAILED --topic b", 0, 1, 0, 1)
		if code, _, _ := ctl(t, b.with("prune", "--older-than", "1ns", "--status", "PENDING")...); code != 2 {
			t.Fatalf("prune --status PENDING: exit %d, want 2", code)
		}
		want("after a refused prune", 0, 1, 0, 1)
	})
}

// TestCancel: cancel needs an explicit target (--id, or --status PENDING or
// FAILED with a filter or --all) and a confirmation (--yes, or yes typed
// on a terminal); a dry run counts; progress goes to stderr.
func TestCancel(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		mustCtl(t, b.with("migrate", "up")...)
		st := openStore(t, b).store
		ids := seed(t, st, "a/FAILED", "a/FAILED", "b/FAILED", "a/PENDING", "b/SENT")
		for _, c := range []struct {
			args []string
			term bool
			in   string
			code int
		}{
			{[]string{"cancel"}, false, "", 2},                                       // no target
			{[]string{"cancel", "--status", "FAILED"}, false, "", 2},                 // status alone: needs --all
			{[]string{"cancel", "--topic", "a"}, false, "", 2},                       // which status?
			{[]string{"cancel", "--status", "SENT", "--all"}, false, "", 2},          // not cancellable
			{[]string{"cancel", "--status", "FAILED", "--topic", "a"}, false, "", 2}, // no --yes, no terminal
			{[]string{"cancel", "--status", "FAILED", "--topic", "a"}, true, "n\n", 1},
			{[]string{"cancel", "--id", ids["a/PENDING"]}, false, "", 2},
		} {
			code, out, errOut := ctlTerminal(t, c.in, c.term, b.with(c.args...)...)
			if code != c.code {
				t.Errorf("%v: exit %d, want %d\n%s%s", c.args, code, c.code, out, errOut)
			}
		}
		if c := counts(t, st); c[outbox.StatusCancelled] != 0 {
			t.Fatalf("refused cancels cancelled: %v", c)
		}
		if out := mustCtl(t, b.with("cancel", "--status", "FAILED", "--topic", "a", "--dry-run")...); !strings.Contains(out, "would cancel 2 FAILED messages") {
			t.Fatalf("cancel --dry-run: %s", out)
		}
		code, out, errOut := ctlTerminal(t, "yes\n", true, b.with("cancel", "--status", "FAILED", "--topic", "a")...)
		if code != 0 || !strings.Contains(out, "cancelled 2 messages") || !strings.Contains(errOut, "cancel: 2 of 2 cancelled") {
			t.Fatalf("cancel confirmed on a terminal: exit %d\n%s%s", code, out, errOut)
		}
		if out := mustCtl(t, b.with("cancel", "--id", ids["a/PENDING"], "--yes")...); !strings.Contains(out, "CANCELLED") {
			t.Fatalf("cancel --id --yes: %s", out)
		}
		if c := counts(t, st); c[outbox.StatusCancelled] != 3 || c[outbox.StatusFailed] != 1 || c[outbox.StatusSent] != 1 {
			t.Fatalf("after cancel: %v; want 3 CANCELLED, b's dead letter and the SENT one untouched", c)
		}
	})
}

// TestShow: show ID prints a message with its payload and attempts; with
// --json, the admin API's shape of GET api/messages/{id}.
func TestShow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		mustCtl(t, b.with("migrate", "up")...)
		st := openStore(t, b).store
		id := seed(t, st, "orders/FAILED")["orders/FAILED"]
		out := mustCtl(t, b.with("show", id)...)
		for _, want := range []string{"ID", id, "STATUS", "FAILED", "LAST ERROR", "http_400: bad request", "PAYLOAD (application/json", `"n": 0`, "ATTEMPTS (1)", "HEADER h"} {
			if !strings.Contains(out, want) {
				t.Errorf("show lacks %q:\n%s", want, out)
			}
		}
		if strings.Count(out, "http_400: bad request") != 2 {
			t.Errorf("show: the attempt's error is not in the attempts table:\n%s", out)
		}
		var d admin.Detail
		if err := json.Unmarshal([]byte(mustCtl(t, b.with("show", "--json", id)...)), &d); err != nil {
			t.Fatal(err)
		}
		if d.Message.ID != id || string(d.Message.Payload) != `{"n":0}` || len(d.Attempts) != 1 || d.Attempts[0].ErrorCode != "http_400" {
			t.Fatalf("show --json: %+v", d)
		}
		if code, _, errOut := ctl(t, b.with("show", "01ARZ3NDEKTSV4RRFFQ69G5FAV")...); code != 1 || errOut == "" {
			t.Errorf("show of an unknown ID: exit %d, %q; want 1", code, errOut)
		}
		if code, _, _ := ctl(t, b.with("show")...); code != 2 {
			t.Errorf("show without an ID: exit %d, want 2", code)
		}
	})
}

// knownMigrations returns the migrations outboxctl knows for b's store.
func knownMigrations(t *testing.T, b backend) []migration {
	t.Helper()
	c := b.conn(render)
	tg, err := c.open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tg.close()
	if len(tg.migrations) < 2 {
		t.Fatalf("%s has %d migrations; the test wants at least 2", b.kind, len(tg.migrations))
	}
	return tg.migrations
}
