package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
)

// set reports whether a filter flag was given.
func (f *filterFlags) set() bool {
	return f.status != "" || f.topic != "" || f.group != "" || f.errorCode != "" || f.after != "" || f.before != ""
}

func cmdRequeue(ctx context.Context, args []string, e env) error {
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
	if *id != "" && (ff.set() || *all || strings.Contains(ff.tenants, ",")) {
		return usagef("--id takes only --tenant")
	}
	var p outbox.MessageRequeueManyParams
	if *id == "" {
		f, err := ff.filter()
		if err != nil {
			return err
		}
		p = outbox.MessageRequeueManyParams{Filter: f, All: *all, DryRun: *dry, Limit: *chunk}
		check := p
		if err := check.Prepare(); err != nil {
			return err
		}
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	if *id != "" {
		if *dry {
			m, err := t.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: ff.tenants, ID: *id})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.out, "dry run: %s is %s\n", m.ID, m.Status)
			return nil
		}
		m, err := t.store.MessageRequeue(ctx, outbox.MessageRequeueParams{Tenant: ff.tenants, ID: *id})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.out, "requeued %s: %s\n", m.ID, m.Status)
		return nil
	}
	a, err := t.admin()
	if err != nil {
		return err
	}
	verb := "requeued"
	if *dry {
		verb = "would requeue"
	}
	var done int
	total, err := outbox.RequeueAll(ctx, a, p, func(r outbox.RequeueManyResult) {
		done += r.Matched
		fmt.Fprintf(e.err, "requeue: %d dead letters %s so far\n", done, map[bool]string{true: "matched", false: "requeued"}[*dry])
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
	fmt.Fprintf(e.out, "%s %d dead letters\n", verb, n)
	return nil
}

func cmdCancel(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	var c conn
	c.register(fs)
	var ff filterFlags
	ff.register(fs)
	id := fs.String("id", "", "cancel this one message (with --tenant)")
	all := fs.Bool("all", false, "cancel every message of --status (required when --status is the only filter)")
	dry := fs.Bool("dry-run", false, "count what would be cancelled, change nothing")
	yes := fs.Bool("yes", false, "confirm: cancelled messages are never published (else asked on a terminal)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var f outbox.MessageFilter
	if *id != "" {
		if ff.set() || *all || strings.Contains(ff.tenants, ",") {
			return usagef("--id takes only --tenant")
		}
	} else {
		var err error
		if f, err = ff.filter(); err != nil {
			return err
		}
		if f.Status != outbox.StatusPending && f.Status != outbox.StatusFailed {
			return usagef("cancel needs --status PENDING or --status FAILED (or --id): which messages to give up")
		}
		narrowed := f
		narrowed.Status = ""
		if narrowed.IsZero() && !*all {
			return usagef("cancel --status %s alone cancels every such message: add a filter or --all", f.Status)
		}
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	if *id != "" {
		m, err := t.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: ff.tenants, ID: *id})
		if err != nil {
			return err
		}
		if *dry {
			fmt.Fprintf(e.out, "dry run: %s is %s\n", m.ID, m.Status)
			return nil
		}
		if err := confirm(e, *yes, fmt.Sprintf("cancel %s (%s, topic %q): it will never be published", m.ID, m.Status, m.Topic)); err != nil {
			return err
		}
		m, err = t.store.MessageCancel(ctx, outbox.MessageCancelParams{Tenant: ff.tenants, ID: *id})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.out, "cancelled %s: %s\n", m.ID, m.Status)
		return nil
	}
	a, err := t.admin()
	if err != nil {
		return err
	}
	// Count first: the confirmation names the number, and a dry run stops
	// there.
	matched := 0
	for after := int64(0); ; {
		page, err := a.MessageSearch(ctx, outbox.MessageSearchParams{Filter: f, AfterSeq: after, Limit: 1000})
		if err != nil {
			return err
		}
		matched += len(page.Messages)
		if after = page.NextAfterSeq; after == 0 {
			break
		}
	}
	if *dry || matched == 0 {
		fmt.Fprintf(e.out, "would cancel %d %s messages\n", matched, f.Status)
		return nil
	}
	if err := confirm(e, *yes, fmt.Sprintf("cancel %d %s messages: they will never be published", matched, f.Status)); err != nil {
		return err
	}
	cancelled := 0
	for after := int64(0); ; {
		page, err := a.MessageSearch(ctx, outbox.MessageSearchParams{Filter: f, AfterSeq: after, Limit: 500})
		if err != nil {
			return fmt.Errorf("stopped after cancelling %d: %w", cancelled, err)
		}
		for _, m := range page.Messages {
			if _, err := t.store.MessageCancel(ctx, outbox.MessageCancelParams{Tenant: m.Tenant, ID: m.ID}); err != nil {
				return fmt.Errorf("stopped after cancelling %d (%s): %w", cancelled, m.ID, err)
			}
			cancelled++
		}
		fmt.Fprintf(e.err, "cancel: %d of %d cancelled\n", cancelled, matched)
		if after = page.NextAfterSeq; after == 0 {
			break
		}
	}
	fmt.Fprintf(e.out, "cancelled %d messages\n", cancelled)
	return nil
}

// pruneDefault are the statuses prune deletes unless --status says
// otherwise: dead letters (FAILED) are kept until named.
var pruneDefault = []outbox.Status{outbox.StatusSent, outbox.StatusDelivered, outbox.StatusCancelled}

func cmdPrune(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	var c conn
	c.register(fs)
	older := fs.Duration("older-than", 0, "delete finished messages last updated longer ago than this, e.g. 720h (required)")
	statuses := fs.String("status", "", "finished statuses to delete, comma-separated (default SENT,DELIVERED,CANCELLED; dead letters only when FAILED is named)")
	topic := fs.String("topic", "", "only this topic")
	dry := fs.Bool("dry-run", false, "count what would be deleted, delete nothing")
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
	sts := pruneDefault
	if *statuses != "" {
		sts = nil
		for _, s := range strings.Split(*statuses, ",") {
			st := outbox.Status(strings.ToUpper(strings.TrimSpace(s)))
			if !st.Finished() {
				return usagef("--status %q: prune deletes finished messages only (SENT, DELIVERED, FAILED, CANCELLED)", s)
			}
			if !slices.Contains(sts, st) {
				sts = append(sts, st)
			}
		}
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	before := time.Now().Add(-*older)
	p := outbox.MessagePruneParams{Before: before, Limit: *chunk, Statuses: sts, Topic: *topic, DryRun: *dry}
	what := fmt.Sprintf("%s messages", joinStatuses(sts))
	if *topic != "" {
		what += fmt.Sprintf(" of topic %q", *topic)
	}
	if *dry {
		n, err := t.store.MessagePrune(ctx, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.out, "would prune %d %s last updated before %s\n", n, what, before.UTC().Format(time.RFC3339))
		return nil
	}
	total := 0
	for {
		n, err := t.store.MessagePrune(ctx, p)
		total += n
		if err != nil {
			return fmt.Errorf("after deleting %d: %w", total, err)
		}
		if n > 0 {
			fmt.Fprintf(e.err, "prune: %d deleted so far\n", total)
		}
		if n < *chunk || ctx.Err() != nil {
			break
		}
	}
	fmt.Fprintf(e.out, "pruned %d %s last updated before %s\n", total, what, before.UTC().Format(time.RFC3339))
	return nil
}

func joinStatuses(sts []outbox.Status) string {
	s := make([]string, len(sts))
	for i, st := range sts {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func cmdShow(ctx context.Context, args []string, e env) error {
	var id string
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	var c conn
	c.register(fs)
	tenant := fs.String("tenant", "", "the message's tenant")
	asJSON := fs.Bool("json", false, "print the message and its attempts as the admin API does (GET api/messages/{id})")
	if err := parse(fs, args, &id); err != nil {
		return err
	}
	if id == "" {
		return usagef("show needs a message ID: outboxctl show ID --url URL [--tenant T]")
	}
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	m, err := t.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: *tenant, ID: id})
	if err != nil {
		return err
	}
	atts, err := t.store.AttemptList(ctx, outbox.AttemptListParams{Tenant: *tenant, MessageID: id})
	if err != nil {
		return err
	}
	d := admin.Detail{Message: admin.NewMessage(m), Attempts: make([]admin.Attempt, 0, len(atts))}
	for _, a := range atts {
		d.Attempts = append(d.Attempts, admin.NewAttempt(a))
	}
	if *asJSON {
		return json.NewEncoder(e.out).Encode(d)
	}
	printDetail(e, d, m)
	return nil
}

// printDetail prints a message, its payload and its attempts for a reader.
func printDetail(e env, d admin.Detail, m outbox.Message) {
	tw := tabwriter.NewWriter(e.out, 2, 4, 2, ' ', 0)
	when := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	j := d.Message
	rows := [][2]string{
		{"ID", j.ID}, {"SEQ", fmt.Sprint(j.Seq)}, {"TENANT", j.Tenant}, {"TOPIC", j.Topic}, {"GROUP", j.Group},
		{"IDEMPOTENCY KEY", j.IdempotencyKey}, {"STATUS", string(j.Status)},
		{"ATTEMPTS", attemptsOf(j.Attempts, j.MaxAttempts)},
		{"NEXT ATTEMPT", when(optional(j.NextAttemptAt))}, {"PROVIDER ID", j.ProviderMessageID},
		{"CREATED", when(&j.CreatedAt)}, {"UPDATED", when(&j.UpdatedAt)},
		{"SENT", when(j.SentAt)}, {"DELIVERED", when(j.DeliveredAt)}, {"READ", when(j.ReadAt)},
	}
	if j.ErrorCode != "" || j.ErrorMessage != "" {
		rows = append(rows, [2]string{"LAST ERROR", j.ErrorCode + ": " + j.ErrorMessage})
	}
	if j.BlocksGroup {
		rows = append(rows, [2]string{"BLOCKS GROUP", "yes: the group waits for a requeue or cancel"})
	}
	for k, v := range m.Headers {
		rows = append(rows, [2]string{"HEADER " + k, v})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	_ = tw.Flush()
	fmt.Fprintf(e.out, "\nPAYLOAD (%s, %d bytes)\n", or(m.ContentType, "application/json"), len(m.Payload))
	if m.IsJSON() {
		var b bytes.Buffer
		if err := json.Indent(&b, m.Payload, "", "  "); err == nil {
			fmt.Fprintln(e.out, b.String())
		} else {
			fmt.Fprintln(e.out, string(m.Payload))
		}
	} else {
		fmt.Fprintln(e.out, "base64:", base64.StdEncoding.EncodeToString(m.Payload))
	}
	fmt.Fprintf(e.out, "\nATTEMPTS (%d)\n", len(d.Attempts))
	if len(d.Attempts) == 0 {
		return
	}
	tw = tabwriter.NewWriter(e.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tOUTCOME\tSTARTED\tFINISHED\tERROR\tNEXT ATTEMPT\tPROVIDER RESPONSE")
	for _, a := range d.Attempts {
		errText := ""
		if a.ErrorCode != "" || a.ErrorMessage != "" {
			errText = a.ErrorCode + ": " + oneLine(a.ErrorMessage, 60)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Number, a.Outcome, when(&a.StartedAt), when(&a.FinishedAt),
			errText, when(a.NextAttemptAt), oneLine(string(a.ProviderResponse), 60))
	}
	_ = tw.Flush()
}

func attemptsOf(n, max int) string {
	if max == 0 {
		return fmt.Sprintf("%d (the processor's maximum)", n)
	}
	return fmt.Sprintf("%d of %d", n, max)
}

func optional(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
