package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
)

func cmdMigrate(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef("migrate needs an action: up, down, status or sql")
	}
	action := args[0]
	fs := flag.NewFlagSet("migrate "+action, flag.ContinueOnError)
	var c conn
	c.register(fs)
	to := fs.Int("to", -1, "up/down: migrate to this version instead of the newest (up) or 0 (down)")
	down := fs.Bool("down", false, "sql: print the down migrations, newest first")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	switch action {
	case "up", "down", "status", "sql":
	default:
		return usagef("unknown migrate action %q (up, down, status, sql)", action)
	}
	c.offline = action == "sql"
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	newest := 0
	if n := len(t.migrations); n > 0 {
		newest = t.migrations[n-1].Version
	}
	switch action {
	case "sql":
		return printSQL(out, t, *down)
	case "up":
		if *to >= 0 {
			err = t.migrator.MigrateTo(ctx, *to)
		} else {
			err = t.migrator.Migrate(ctx)
		}
	case "down":
		err = t.migrator.MigrateTo(ctx, max(*to, 0))
	}
	if err != nil {
		return err
	}
	v, err := t.migrator.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s schema version %d (newest known: %d)\n", t.kind, v, newest)
	if action == "status" {
		for _, m := range t.migrations {
			state := "pending"
			if m.Version <= v {
				state = "applied"
			}
			fmt.Fprintf(out, "%03d_%s\t%s\n", m.Version, m.Name, state)
		}
	}
	return nil
}

// printSQL prints the rendered migrations, ready for psql, mysql, sqlite3,
// mongosh or a migration tool.
func printSQL(out io.Writer, t *target, down bool) error {
	comment, ext := cmp.Or(t.comment, "--"), cmp.Or(t.ext, "sql")
	fmt.Fprintf(out, "%s outboxkit %s schema: %d migrations", comment, t.kind, len(t.migrations))
	if down {
		fmt.Fprint(out, " (down, newest first)")
	}
	fmt.Fprintf(out, ".\n%s outboxctl migrate sql prints what Migrate applies, without its version table.\n", comment)
	if t.kind == "mongo" {
		fmt.Fprint(out, "// MongoDB: mongosh commands for the database of the URL; run them with\n"+
			"// mongosh \"mongodb://host:27017/DB\" FILE.js (Migrate records versions in <prefix>migrations).\n")
	}
	fmt.Fprintln(out)
	if !down && t.preamble != "" {
		fmt.Fprint(out, t.preamble, "\n")
	}
	for i := range t.migrations {
		m := t.migrations[i]
		text, dir := m.Up, "up"
		if down {
			m = t.migrations[len(t.migrations)-1-i]
			text, dir = m.Down, "down"
		}
		fmt.Fprintf(out, "%s %03d_%s.%s.%s\n%s", comment, m.Version, m.Name, dir, ext, strings.TrimRight(text, "\n")+"\n\n")
	}
	return nil
}

// filterFlags are the operator filter's flags.
type filterFlags struct {
	status, topic, group, tenants, errorCode, after, before string
}

func (f *filterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.status, "status", "", "status: PENDING, PROCESSING, SENT, DELIVERED, FAILED, CANCELLED")
	fs.StringVar(&f.topic, "topic", "", "topic")
	fs.StringVar(&f.group, "group", "", "group")
	fs.StringVar(&f.tenants, "tenant", "", "tenant(s), comma-separated (default every tenant)")
	fs.StringVar(&f.errorCode, "error-code", "", "code of the last error")
	fs.StringVar(&f.after, "created-after", "", "created at or after (RFC 3339)")
	fs.StringVar(&f.before, "created-before", "", "created before (RFC 3339)")
}

func (f *filterFlags) filter() (outbox.MessageFilter, error) {
	mf := outbox.MessageFilter{
		Status: outbox.Status(strings.ToUpper(f.status)), Topic: f.topic, Group: f.group, ErrorCode: f.errorCode,
	}
	if f.tenants != "" {
		mf.Tenants = strings.Split(f.tenants, ",")
	}
	for _, p := range []struct {
		name, v string
		dst     *time.Time
	}{{"--created-after", f.after, &mf.CreatedAfter}, {"--created-before", f.before, &mf.CreatedBefore}} {
		if p.v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, p.v)
		if err != nil {
			return mf, usagef("%s %q is not an RFC 3339 time", p.name, p.v)
		}
		*p.dst = t
	}
	return mf, mf.Validate()
}

func cmdStats(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	var c conn
	c.register(fs)
	tenants := fs.String("tenant", "", "tenant(s), comma-separated (default every tenant)")
	watch := fs.Bool("watch", false, "print again every --interval until interrupted, with the drain rate")
	interval := fs.Duration("interval", 2*time.Second, "--watch: time between prints")
	times := fs.Int("times", 0, "--watch: stop after this many prints (0: until interrupted)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *interval <= 0 {
		return usagef("--interval must be positive")
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	a, err := t.admin()
	if err != nil {
		return err
	}
	p := outbox.TopicStatsParams{}
	if *tenants != "" {
		p.Tenants = strings.Split(*tenants, ",")
	}
	var prevOpen int64 = -1
	var prevAt time.Time
	for i := 0; ; i++ {
		stats, err := a.TopicStats(ctx, p)
		if err != nil {
			return err
		}
		now := time.Now()
		open := printStats(out, stats, now)
		if *watch && prevOpen >= 0 {
			rate := float64(prevOpen-open) / now.Sub(prevAt).Seconds()
			line := fmt.Sprintf("open (PENDING+PROCESSING): %d, draining %.1f msg/s", open, rate)
			if rate > 0 && open > 0 {
				line += fmt.Sprintf(", about %s left", (time.Duration(float64(open)/rate) * time.Second).Round(time.Second))
			}
			fmt.Fprintln(out, line)
		}
		if !*watch || (*times > 0 && i+1 >= *times) {
			return nil
		}
		prevOpen, prevAt = open, now
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
		fmt.Fprintln(out)
	}
}

// printStats prints a table of stats and returns the number of open
// (PENDING or PROCESSING) messages.
func printStats(out io.Writer, stats []outbox.TopicStat, now time.Time) int64 {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "TOPIC\t")
	for _, st := range outbox.Statuses() {
		fmt.Fprintf(tw, "%s\t", st)
	}
	fmt.Fprintf(tw, "OLDEST PENDING\t\n")
	totals := map[outbox.Status]int64{}
	var open int64
	for _, s := range stats {
		fmt.Fprintf(tw, "%s\t", s.Topic)
		for _, st := range outbox.Statuses() {
			fmt.Fprintf(tw, "%d\t", s.Counts[st])
			totals[st] += s.Counts[st]
		}
		age := "-"
		if !s.OldestPendingAt.IsZero() {
			age = s.OldestPendingAge(now).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t\n", age)
	}
	fmt.Fprintf(tw, "TOTAL\t")
	for _, st := range outbox.Statuses() {
		fmt.Fprintf(tw, "%d\t", totals[st])
	}
	fmt.Fprintf(tw, "\t\n")
	_ = tw.Flush()
	open = totals[outbox.StatusPending] + totals[outbox.StatusProcessing]
	return open
}

func cmdList(ctx context.Context, args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	var c conn
	c.register(fs)
	var ff filterFlags
	ff.register(fs)
	limit := fs.Int("limit", 100, "messages to print (at most 1000)")
	after := fs.Int64("after-seq", 0, "continue after this sequence (the \"next:\" line of a previous list)")
	asJSON := fs.Bool("json", false, "print one JSON object per line per message, as the admin API shapes it (the \"next:\" hint goes to stderr)")
	if err := parse(fs, args); err != nil {
		return err
	}
	f, err := ff.filter()
	if err != nil {
		return err
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	a, err := t.admin()
	if err != nil {
		return err
	}
	page, err := a.MessageSearch(ctx, outbox.MessageSearchParams{Filter: f, AfterSeq: *after, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		for _, m := range page.Messages {
			if err := enc.Encode(admin.NewMessage(m)); err != nil {
				return err
			}
		}
		if page.NextAfterSeq != 0 {
			// stdout stays JSON lines: the hint goes to stderr.
			fmt.Fprintf(errOut, "next: --after-seq %d\n", page.NextAfterSeq)
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tTENANT\tTOPIC\tGROUP\tSTATUS\tATTEMPTS\tERROR\tCREATED")
	for _, m := range page.Messages {
		e := ""
		if m.LastError != nil {
			e = m.LastError.Code + ": " + oneLine(m.LastError.Message, 60)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.Seq, m.ID, m.Tenant, m.Topic, m.Group, m.Status,
			m.Attempts, e, m.CreatedAt.Format(time.RFC3339))
	}
	_ = tw.Flush()
	if page.NextAfterSeq != 0 {
		fmt.Fprintf(out, "next: --after-seq %d\n", page.NextAfterSeq)
	}
	return nil
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func cmdRequeue(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("requeue", flag.ContinueOnError)
	var c conn
	c.register(fs)
	var ff filterFlags
	ff.register(fs)
	id := fs.String("id", "", "requeue this one message (with --tenant)")
	all := fs.Bool("all", false, "requeue every dead letter (required when no filter is given)")
	dry := fs.Bool("dry-run", false, "count what would be requeued, change nothing")
	chunk := fs.Int("chunk", 500, "messages per call: one transaction on SQL stores (at most 1000)")
	if err := parse(fs, args); err != nil {
		return err
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	if *id != "" {
		if ff.status != "" || ff.topic != "" || ff.group != "" || ff.errorCode != "" || ff.after != "" || ff.before != "" || *all || strings.Contains(ff.tenants, ",") {
			return usagef("--id takes only --tenant")
		}
		if *dry {
			m, err := t.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: ff.tenants, ID: *id})
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "dry run: %s is %s\n", m.ID, m.Status)
			return nil
		}
		m, err := t.store.MessageRequeue(ctx, outbox.MessageRequeueParams{Tenant: ff.tenants, ID: *id})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "requeued %s: %s\n", m.ID, m.Status)
		return nil
	}
	f, err := ff.filter()
	if err != nil {
		return err
	}
	a, err := t.admin()
	if err != nil {
		return err
	}
	p := outbox.MessageRequeueManyParams{Filter: f, All: *all, DryRun: *dry, Limit: *chunk}
	check := p
	if err := outbox.ValidateRequeueMany(&check); err != nil {
		return err
	}
	verb := "requeued"
	if *dry {
		verb = "would requeue"
	}
	total, err := outbox.RequeueAll(ctx, a, p, func(r outbox.RequeueManyResult) {
		if *dry {
			fmt.Fprintf(out, "chunk: %d matched\n", r.Matched)
		} else {
			fmt.Fprintf(out, "chunk: %d requeued\n", r.Requeued)
		}
	})
	if err != nil {
		if total.NextAfterSeq != 0 {
			return fmt.Errorf("stopped after %d (resume with the same filter; already requeued messages are PENDING now): %w", total.Requeued, err)
		}
		return err
	}
	n := total.Requeued
	if *dry {
		n = total.Matched
	}
	fmt.Fprintf(out, "%s %d dead letters\n", verb, n)
	return nil
}

func cmdPrune(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	var c conn
	c.register(fs)
	older := fs.Duration("older-than", 0, "delete finished messages (SENT, DELIVERED, FAILED, CANCELLED) last updated longer ago than this, e.g. 720h (required)")
	chunk := fs.Int("chunk", 1000, "messages per statement")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *older <= 0 {
		return usagef("--older-than is required and must be positive")
	}
	if *chunk <= 0 {
		return usagef("--chunk must be positive")
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	before := time.Now().Add(-*older)
	total := 0
	for {
		n, err := t.store.MessagePrune(ctx, outbox.MessagePruneParams{Before: before, Limit: *chunk})
		total += n
		if err != nil {
			return fmt.Errorf("after deleting %d: %w", total, err)
		}
		if n < *chunk || ctx.Err() != nil {
			break
		}
	}
	fmt.Fprintf(out, "pruned %d finished messages last updated before %s\n", total, before.UTC().Format(time.RFC3339))
	return nil
}

func cmdPause(ctx context.Context, verb string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	var c conn
	c.register(fs)
	topic := fs.String("topic", "", "the topic")
	group := fs.String("group", "", "one group of the topic (default every group)")
	tenant := fs.String("tenant", "", "one tenant (default every tenant)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *topic == "" && (verb == "resume" || *group != "" || *tenant != "") {
		return usagef("%s needs --topic", verb)
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	a, err := t.admin()
	if err != nil {
		return err
	}
	switch {
	case verb == "resume":
		ok, err := a.PauseRemove(ctx, outbox.PauseRemoveParams{Topic: *topic, Group: *group, Tenant: *tenant})
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("no such pause: topic %q, group %q, tenant %q", *topic, *group, *tenant)
		}
		fmt.Fprintf(out, "resumed topic %q group %q tenant %q\n", *topic, *group, *tenant)
	case *topic != "":
		if err := a.PauseAdd(ctx, outbox.PauseAddParams{Topic: *topic, Group: *group, Tenant: *tenant}); err != nil {
			return err
		}
		fmt.Fprintf(out, "paused topic %q group %q tenant %q\n", *topic, *group, *tenant)
	default:
		ps, err := a.PauseList(ctx, outbox.PauseListParams{})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tGROUP\tTENANT\tSINCE")
		for _, p := range ps {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Topic, or(p.Group, "(all)"), or(p.Tenant, "(all)"), p.CreatedAt.Format(time.RFC3339))
		}
		_ = tw.Flush()
	}
	return nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// errNoStorageReport is returned by storage for a store that does not
// implement outbox.StorageReporter.
var errNoStorageReport = errors.New("the store does not report its storage (store/postgres does)")

func cmdStorage(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("storage", flag.ContinueOnError)
	var c conn
	c.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	sr, ok := t.store.(outbox.StorageReporter)
	if !ok {
		return fmt.Errorf("%s: %w", t.kind, errNoStorageReport)
	}
	st, err := sr.StorageStats(ctx)
	if err != nil {
		return err
	}
	printStorage(out, st)
	return nil
}

// printStorage prints a storage report: a table per table, then the
// cleanup horizon.
func printStorage(out io.Writer, st outbox.StorageStats) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tLIVE ROWS\tDEAD ROWS\tLAST VACUUM")
	for _, tb := range st.Tables {
		last := "never"
		if !tb.LastCleanup.IsZero() {
			last = tb.LastCleanup.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", tb.Name, tb.LiveRows, tb.DeadRows, last)
	}
	_ = tw.Flush()
	if st.Horizon.Holder == "" {
		fmt.Fprintln(out, "cleanup horizon: nothing holds it back")
		return
	}
	fmt.Fprintf(out, "cleanup horizon: %d transactions old, held by %s\n", st.Horizon.AgeTransactions, st.Horizon.Holder)
}
