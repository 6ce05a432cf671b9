// Command outboxctl operates an outboxkit store from the command line:
// schema migrations (and their SQL, for teams that run goose, atlas or
// flyway; for MongoDB, mongosh commands), stats with a live view of a
// draining backlog, listing and showing messages, bulk requeue and cancel,
// pruning, pauses and the storage report.
//
//	go install github.com/outboxkit/outboxkit/outbox/cmd/outboxctl@latest
//
//	outboxctl migrate up     --url URL [--to N] [--dry-run]
//	outboxctl migrate down   --url URL [--to N] [--dry-run] [--yes]
//	outboxctl migrate status --url URL
//	outboxctl migrate sql    --url URL [--down]
//	outboxctl stats    --url URL [--tenant T] [--watch] [--interval 2s]
//	outboxctl list     --url URL [FILTER] [--limit 100] [--after-seq N] [--json]
//	outboxctl show     ID --url URL [--tenant T] [--json]
//	outboxctl requeue  --url URL [FILTER] [--all] [--dry-run] [--chunk 500]
//	outboxctl requeue  --url URL --id ID [--tenant T] [--dry-run]
//	outboxctl cancel   --url URL --status PENDING|FAILED [FILTER] [--all] [--dry-run] [--yes]
//	outboxctl cancel   --url URL --id ID [--tenant T] [--dry-run] [--yes]
//	outboxctl prune    --url URL --older-than 720h [--status S,...] [--topic T] [--dry-run] [--chunk 1000]
//	outboxctl pause    --url URL [--topic T [--group G] [--tenant T]]
//	outboxctl resume   --url URL --topic T [--group G] [--tenant T]
//	outboxctl storage  --url URL
//
// Every PostgreSQL command also takes --schema, every command --prefix
// (the tables' or collections' prefix). A command refuses any word it does
// not understand, before it connects: nothing is changed by a line that
// was mistyped.
//
// FILTER: --status, --topic, --group, --tenant (comma-separated for
// several), --error-code, --created-after, --created-before (RFC 3339).
//
// URL: postgres://… or postgresql://… (pgx), mysql://user:pass@host:3306/db
// (MySQL or MariaDB), sqlite:///path/to/file.db or sqlite:relative.db,
// mongodb://user:pass@host:27017/db or mongodb+srv://… (MongoDB or a
// compatible server; the path names the database, --prefix the collection
// prefix). The URL may also come from OUTBOXCTL_URL. Credentials are never
// printed. Only "migrate up" creates anything (a SQLite file, a schema,
// tables): every other command on a database that was never migrated says
// "not migrated (outboxctl migrate up)".
//
// "migrate down" reverts one migration; --to N reverts down to version N.
// Version 0 removes every table (collection) of the store with its data:
// it is never reached by default, only by an explicit --to 0, confirmed by
// --yes or, on a terminal, by typing yes. "cancel" asks the same
// confirmation. "prune" deletes SENT, DELIVERED and CANCELLED messages by
// default; dead letters (FAILED) only when --status names FAILED.
//
// For MongoDB, "migrate sql" prints mongosh commands (db.runCommand with
// createIndexes, the version records, and collection drops for --down),
// to run with mongosh "mongodb://host:27017/db" file.js; the other
// commands work as for SQL stores.
//
// Exit status:
//
//	0  success
//	1  an operation failed (or a confirmation was declined); nothing more was changed
//	2  bad usage: an unknown flag or word, a bad filter, a bulk change without
//	   a filter or --all, a destructive change without its confirmation
//	3  the schema is behind: "migrate status" with pending migrations, or any
//	   other command on a database that was never migrated
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/outboxkit/outboxkit/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e := env{in: os.Stdin, out: os.Stdout, err: os.Stderr}
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		e.terminal = true
	}
	code := run(ctx, os.Args[1:], e)
	stop()
	os.Exit(code)
}

const usage = `usage: outboxctl COMMAND --url URL [flags]

commands:
  migrate up|down|status|sql   apply, revert (one step, or --to N), show or print the schema
                               migrations (sql: SQL, or mongosh commands for mongodb:// URLs);
                               status exits 3 when migrations are pending
  stats                        counts by status and oldest pending age per topic (--watch: live)
  list                         messages of every tenant matching a filter (--json: JSON lines)
  show ID                      one message with its payload and attempts
  requeue                      dead letters back to PENDING (by filter in chunks, or --id)
  cancel                       PENDING messages or dead letters to CANCELLED (by filter, or --id;
                               confirmed by --yes or on a terminal)
  prune                        delete finished messages older than --older-than (dead letters
                               only with --status FAILED)
  pause, resume                stop or restart the claiming of a --topic (or one --group of it);
                               pause without --topic lists the pauses
  storage                      the tables' live and dead rows, their last vacuum, and what
                               holds the database's cleanup back (PostgreSQL)

URL: postgres://…, mysql://user@host:3306/db, sqlite:///path/file.db,
mongodb://host:27017/db (or $OUTBOXCTL_URL).

Exit status: 0 done, 1 failed, 2 bad usage (nothing changed), 3 not migrated
or migrations pending.

Run "outboxctl COMMAND -h" for a command's flags.
`

// env is what a command reads and writes besides the store.
type env struct {
	in       io.Reader
	out, err io.Writer
	// terminal: stdin is a terminal, so a confirmation may be asked there
	// instead of requiring --yes.
	terminal bool
}

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// Errors with an exit status of their own.
var (
	// errNotMigrated: the database has no outboxkit schema (exit 3).
	errNotMigrated = errors.New("not migrated (outboxctl migrate up)")
	// errPending: migrate status found migrations to apply (exit 3).
	errPending = errors.New("migrations pending (outboxctl migrate up)")
	// errDeclined: the operator did not confirm (exit 1).
	errDeclined = errors.New("not confirmed: nothing changed")
)

// run runs one command and returns the exit status.
func run(ctx context.Context, args []string, e env) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(e.err, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "migrate":
		err = cmdMigrate(ctx, args[1:], e)
	case "stats":
		err = cmdStats(ctx, args[1:], e)
	case "list":
		err = cmdList(ctx, args[1:], e)
	case "show":
		err = cmdShow(ctx, args[1:], e)
	case "requeue":
		err = cmdRequeue(ctx, args[1:], e)
	case "cancel":
		err = cmdCancel(ctx, args[1:], e)
	case "prune":
		err = cmdPrune(ctx, args[1:], e)
	case "pause", "resume":
		err = cmdPause(ctx, args[0], args[1:], e)
	case "storage":
		err = cmdStorage(ctx, args[1:], e)
	default:
		err = usagef("unknown command %q", args[0])
	}
	return exitStatus(err, e.err)
}

// exitStatus prints err (if any) and maps it to the documented status.
func exitStatus(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue), errors.Is(err, outbox.ErrInvalidInput), errors.Is(err, errFlags):
		fmt.Fprintln(stderr, "outboxctl:", err)
		if errors.As(err, &ue) && strings.HasPrefix(ue.msg, "unknown command") {
			fmt.Fprint(stderr, usage)
		}
		return 2
	case errors.Is(err, errNotMigrated), errors.Is(err, errPending):
		fmt.Fprintln(stderr, "outboxctl:", err)
		return 3
	default:
		fmt.Fprintln(stderr, "outboxctl:", err)
		return 1
	}
}

// confirm asks the operator to confirm what (a sentence saying what will
// be lost) unless yes: on a terminal by typing yes; otherwise it refuses,
// as bad usage, naming --yes.
func confirm(e env, yes bool, what string) error {
	if yes {
		return nil
	}
	if !e.terminal {
		return usagef("%s: confirm with --yes (stdin is not a terminal to ask)", what)
	}
	fmt.Fprintf(e.err, "%s.\nType yes to go on: ", what)
	line, _ := bufio.NewReader(e.in).ReadString('\n')
	if strings.EqualFold(strings.TrimSpace(line), "yes") {
		return nil
	}
	return errDeclined
}
