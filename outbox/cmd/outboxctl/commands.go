package main

import (
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

func cmdStats(ctx context.Context, args []string, e env) error {
	out := e.out
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
	if !*watch {
		if err := onlyFlags(fs, "stats without --watch", "tenant"); err != nil {
			return err
		}
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

func cmdList(ctx context.Context, args []string, e env) error {
	out := e.out
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
			fmt.Fprintf(e.err, "next: --after-seq %d\n", page.NextAfterSeq)
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

func cmdPause(ctx context.Context, verb string, args []string, e env) error {
	out := e.out
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

func cmdStorage(ctx context.Context, args []string, e env) error {
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
	printStorage(e.out, st)
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
