// Package adminsql renders the SQL pieces of the outbox.Admin methods that
// the SQL stores share: the operator filter and the pause check of the
// claim. Column names are the stores' common ones (tenant, topic, grp,
// status, last_error_code, created_at); the pauses table has pause_topic,
// pause_grp, pause_tenant and created_at, named apart from the messages'
// columns so that the check can refer to an unqualified outer row.
package adminsql

import (
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Args collects query arguments and renders their placeholders: "?" or,
// with Dollar, "$1", "$2", ... (numbered from Offset+1).
type Args struct {
	Dollar bool
	Offset int
	Vals   []any
}

// Add appends v and returns its placeholder.
func (a *Args) Add(v any) string {
	a.Vals = append(a.Vals, v)
	if a.Dollar {
		return "$" + strconv.Itoa(a.Offset+len(a.Vals))
	}
	return "?"
}

// Filter returns the conditions (to be joined with AND) that select f,
// over columns qualified by prefix ("" or "m."). tm converts a time to the
// store's stored form.
func Filter(f outbox.MessageFilter, prefix string, a *Args, tm func(time.Time) any) []string {
	var w []string
	if len(f.Tenants) > 0 {
		ph := make([]string, len(f.Tenants))
		for i, t := range f.Tenants {
			ph[i] = a.Add(t)
		}
		w = append(w, prefix+"tenant IN ("+strings.Join(ph, ", ")+")")
	}
	if f.Status != "" {
		w = append(w, prefix+"status = "+a.Add(string(f.Status)))
	}
	if f.Topic != "" {
		w = append(w, prefix+"topic = "+a.Add(f.Topic))
	}
	if f.Group != "" {
		w = append(w, prefix+"grp = "+a.Add(f.Group))
	}
	if f.ErrorCode != "" {
		w = append(w, prefix+"last_error_code = "+a.Add(f.ErrorCode))
	}
	if !f.CreatedAfter.IsZero() {
		w = append(w, prefix+"created_at >= "+a.Add(tm(f.CreatedAfter)))
	}
	if !f.CreatedBefore.IsZero() {
		w = append(w, prefix+"created_at < "+a.Add(tm(f.CreatedBefore)))
	}
	if f.BlocksGroup {
		w = append(w, prefix+"blocks_group = "+a.Add(true))
	}
	return w
}

// NotPaused is the claim's condition that the message row (columns
// qualified by prefix, "" for an unqualified outer row) is covered by no
// pause in the table pauses.
func NotPaused(pauses, prefix string) string {
	return notPaused(pauses, prefix, "")
}

// NotPausedRowByRow is NotPaused for PostgreSQL, checked row by row as the
// rows are read: OFFSET 0 keeps the planner from turning the NOT EXISTS
// into an anti join. Planned without statistics (a table never analysed),
// that join was a hash anti join, which reads every pending message before
// the claim's LIMIT can stop the scan.
func NotPausedRowByRow(pauses, prefix string) string {
	return notPaused(pauses, prefix, " OFFSET 0")
}

func notPaused(pauses, prefix, tail string) string {
	return ` AND NOT EXISTS (SELECT 1 FROM ` + pauses + ` WHERE pause_topic = ` + prefix + `topic
		AND pause_grp IN ('', ` + prefix + `grp) AND pause_tenant IN ('', ` + prefix + `tenant)` + tail + `)`
}

// Where joins conditions into a WHERE clause ("" when there are none).
func Where(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// AddStat adds the count of one (topic, status) to stats, whose rows
// arrive ordered by topic; oldest is the status's oldest CreatedAt.
// store/mongo assembles its topic stats with it too.
func AddStat(stats []outbox.TopicStat, topic string, st outbox.Status, n int64, oldest time.Time) []outbox.TopicStat {
	if len(stats) == 0 || stats[len(stats)-1].Topic != topic {
		c := make(map[outbox.Status]int64, len(outbox.Statuses()))
		for _, x := range outbox.Statuses() {
			c[x] = 0
		}
		stats = append(stats, outbox.TopicStat{Topic: topic, Counts: c})
	}
	last := &stats[len(stats)-1]
	last.Counts[st] += n
	if st == outbox.StatusPending {
		last.OldestPendingAt = oldest
	}
	return stats
}
