// Command outboxctl operates an outboxkit store from the command line:
// schema migrations (and their SQL, for teams that run goose, atlas or
// flyway; for MongoDB, mongosh commands), stats with a live view of a draining backlog, listing, bulk
// requeue of dead letters and pruning.
//
//	go install github.com/outboxkit/outboxkit/outbox/cmd/outboxctl@latest
//
//	outboxctl migrate up|down|status|sql  --url URL [--prefix P] [--schema S] [--down]
//	outboxctl stats    --url URL [--tenant T] [--watch] [--interval 2s]
//	outboxctl list     --url URL [FILTER] [--limit 100] [--after-seq N] [--json]
//	outboxctl requeue  --url URL [FILTER] [--all] [--dry-run] [--chunk 500]
//	outboxctl requeue  --url URL --id ID [--tenant T]
//	outboxctl prune    --url URL --older-than 720h [--chunk 1000]
//	outboxctl pause    --url URL [--topic T [--group G] [--tenant T]]
//	outboxctl resume   --url URL --topic T [--group G] [--tenant T]
//	outboxctl storage  --url URL
//
// FILTER: --status, --topic, --group, --tenant (comma-separated for
// several), --error-code, --created-after, --created-before (RFC 3339).
//
// URL: postgres://… or postgresql://… (pgx), mysql://user:pass@host:3306/db
// (MySQL or MariaDB), sqlite:///path/to/file.db or sqlite:relative.db,
// mongodb://user:pass@host:27017/db or mongodb+srv://… (MongoDB or a
// compatible server; the path names the database, --prefix the collection
// prefix). The URL may also come from OUTBOXCTL_URL. Credentials are never
// printed.
//
// For MongoDB, "migrate sql" prints mongosh commands (db.runCommand with
// createIndexes, and collection drops for --down), to run with
// mongosh "mongodb://host:27017/db" file.js; the other commands work as
// for SQL stores.
//
// Exit status: 0 on success, 1 when an operation failed, 2 on bad usage
// (an unknown flag, a bad filter, a bulk requeue without a filter or
// --all).
package main

import (
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
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: outboxctl COMMAND --url URL [flags]

commands:
  migrate up|down|status|sql   apply, remove, show or print the schema migrations
                               (sql: SQL, or mongosh commands for mongodb:// URLs)
  stats                        counts by status and oldest pending age per topic (--watch: live)
  list                         messages of every tenant matching a filter
  requeue                      dead letters back to PENDING (by filter in chunks, or --id)
  prune                        delete finished messages older than --older-than
  pause, resume                stop or restart the claiming of a --topic (or one --group of it);
                               pause without --topic lists the pauses
  storage                      the tables' live and dead rows, their last vacuum, and what
                               holds the database's cleanup back (PostgreSQL)

URL: postgres://…, mysql://user@host:3306/db, sqlite:///path/file.db,
mongodb://host:27017/db (or $OUTBOXCTL_URL).

Run "outboxctl COMMAND -h" for a command's flags.
`

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// run runs one command and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "migrate":
		err = cmdMigrate(ctx, args[1:], stdout)
	case "stats":
		err = cmdStats(ctx, args[1:], stdout)
	case "list":
		err = cmdList(ctx, args[1:], stdout, stderr)
	case "requeue":
		err = cmdRequeue(ctx, args[1:], stdout)
	case "prune":
		err = cmdPrune(ctx, args[1:], stdout)
	case "pause", "resume":
		err = cmdPause(ctx, args[0], args[1:], stdout)
	case "storage":
		err = cmdStorage(ctx, args[1:], stdout)
	default:
		err = usagef("unknown command %q", args[0])
	}
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue), errors.Is(err, outbox.ErrInvalidInput), errors.Is(err, errFlags):
		fmt.Fprintln(stderr, "outboxctl:", err)
		if errors.As(err, &ue) && strings.HasPrefix(ue.msg, "unknown command") {
			fmt.Fprint(stderr, usage)
		}
		return 2
	default:
		fmt.Fprintln(stderr, "outboxctl:", err)
		return 1
	}
}
