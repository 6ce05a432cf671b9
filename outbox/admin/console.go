package admin

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// ProcessorReporter is what the console shows of a processor running in
// the host's process: *outbox.Processor implements it. Pass them in
// Config.Processors; processors of other processes show only through the
// leases they hold in the store.
type ProcessorReporter interface {
	ID() string
	Health() outbox.Health
	Progress() outbox.Progress
}

// scanPage is the page size of the console's bounded scans.
const scanPage = 1000

// scan calls fn for each message matching f in Seq order, at most limit
// messages, and reports whether it saw them all. fn returns false to stop.
func (h *Handler) scan(ctx context.Context, f outbox.MessageFilter, limit int, fn func(m outbox.Message) bool) (scanned int, complete bool, err error) {
	after := int64(0)
	for scanned < limit {
		page, err := h.admin.MessageSearch(ctx, outbox.MessageSearchParams{Filter: f, AfterSeq: after, Limit: min(scanPage, limit-scanned)})
		if err != nil {
			return scanned, false, err
		}
		for _, m := range page.Messages {
			scanned++
			if !fn(m) {
				return scanned, false, nil
			}
		}
		if page.NextAfterSeq == 0 {
			return scanned, true, nil
		}
		after = page.NextAfterSeq
	}
	return scanned, false, nil
}

// SearchResult is the answer of GET api/search.
type SearchResult struct {
	Messages []Message `json:"messages"`
	// Scanned is how many messages were read; Complete reports that they
	// were all the store has (else Config.ScanLimit stopped the search).
	Scanned  int  `json:"scanned"`
	Complete bool `json:"complete"`
}

// search finds messages by ID, idempotency key or provider message ID.
func (h *Handler) search(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "q", "tenant") {
		return
	}
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" || len(q) > outbox.MaxKeyLength {
		h.fail(w, r, outbox.InvalidParam("q", "must be an ID, an idempotency key or a provider message ID"))
		return
	}
	out := SearchResult{Messages: []Message{}}
	var f outbox.MessageFilter
	if r.URL.Query().Has("tenant") {
		tenant := r.URL.Query().Get("tenant")
		f.Tenants = []string{tenant}
		// An ID within a known tenant is one lookup.
		if m, err := h.store.MessageGet(r.Context(), outbox.MessageGetParams{Tenant: tenant, ID: q}); err == nil {
			out.Messages = append(out.Messages, NewMessage(m))
			out.Scanned, out.Complete = 1, true
			writeJSON(w, http.StatusOK, out)
			return
		} else if !errors.Is(err, outbox.ErrNotFound) {
			h.fail(w, r, err)
			return
		}
	}
	var err error
	out.Scanned, out.Complete, err = h.scan(r.Context(), f, h.cfg.ScanLimit, func(m outbox.Message) bool {
		if m.ID == q || m.IdempotencyKey == q || (m.ProviderMessageID != "" && m.ProviderMessageID == q) {
			out.Messages = append(out.Messages, NewMessage(m))
		}
		return len(out.Messages) < 100
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// CancelRequest is the body of POST api/cancel: cancel the PENDING or
// FAILED messages that match a filter.
type CancelRequest struct {
	// Filter selects the messages; its status must be PENDING or FAILED.
	Filter Filter `json:"filter"`
	DryRun bool   `json:"dry_run"`
	// AfterSeq continues an earlier request (its next_after_seq).
	AfterSeq int64 `json:"after_seq"`
}

// CancelResponse is the answer of POST api/cancel.
type CancelResponse struct {
	Matched   int  `json:"matched"`
	Cancelled int  `json:"cancelled"`
	DryRun    bool `json:"dry_run"`
	// Skipped counts the matches that left the status before their turn
	// (claimed, requeued or cancelled meanwhile).
	Skipped int `json:"skipped"`
	// NextAfterSeq is 0 when every match was handled; otherwise send the
	// request again with after_seq set to it.
	NextAfterSeq int64 `json:"next_after_seq"`
}

// cancelMany cancels the messages of a filter, one by one (each a
// conditional update of its own), at most MaxChunks pages of 500.
func (h *Handler) cancelMany(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	var req CancelRequest
	if err := decodeBody(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	f := req.Filter.filter()
	if err := f.Validate(); err != nil {
		h.fail(w, r, err)
		return
	}
	if f.Status != outbox.StatusPending && f.Status != outbox.StatusFailed {
		h.fail(w, r, outbox.InvalidParam("filter.status", "must be PENDING or FAILED (only those can be cancelled)"))
		return
	}
	if req.AfterSeq < 0 {
		h.fail(w, r, outbox.InvalidParam("after_seq", "is negative"))
		return
	}
	out := CancelResponse{DryRun: req.DryRun}
	after := req.AfterSeq
	for range h.cfg.MaxChunks {
		page, err := h.admin.MessageSearch(r.Context(), outbox.MessageSearchParams{Filter: f, AfterSeq: after, Limit: 500})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		out.Matched += len(page.Messages)
		if !req.DryRun {
			for _, m := range page.Messages {
				_, err := h.store.MessageCancel(r.Context(), outbox.MessageCancelParams{Tenant: m.Tenant, ID: m.ID, Now: h.cfg.Clock.Now()})
				switch {
				case err == nil:
					out.Cancelled++
				case errors.Is(err, outbox.ErrInvalidTransition), errors.Is(err, outbox.ErrNotFound):
					out.Skipped++
				default:
					if out.Cancelled > 0 {
						h.cfg.Logger.WarnContext(r.Context(), "outbox admin: bulk cancel stopped", "cancelled", out.Cancelled, "err", err)
					}
					h.fail(w, r, err)
					return
				}
			}
		}
		out.NextAfterSeq = page.NextAfterSeq
		if page.NextAfterSeq == 0 {
			break
		}
		after = page.NextAfterSeq
	}
	if out.Cancelled > 0 {
		h.cfg.Logger.InfoContext(r.Context(), "outbox admin: messages cancelled", "cancelled", out.Cancelled, "next_after_seq", out.NextAfterSeq)
	}
	writeJSON(w, http.StatusOK, out)
}

// Group is one message group in GET api/groups: its head (the message
// the processor publishes next) and what holds it.
type Group struct {
	Tenant string `json:"tenant"`
	Topic  string `json:"topic"`
	Group  string `json:"group"`
	// Waiting counts the group's PENDING and PROCESSING messages.
	Waiting int      `json:"waiting"`
	Head    *Message `json:"head,omitempty"`
	// HeldBy says what holds the group: "dead_letter" (a FAILED message
	// that blocks it, DeadLetter), "pause", "retry" (the head waits for
	// its retry time, RetryAt), "in_flight" (the head is being
	// published), or "" (the head is due).
	HeldBy     string     `json:"held_by"`
	DeadLetter *Message   `json:"dead_letter,omitempty"`
	RetryAt    *time.Time `json:"retry_at,omitempty"`
	// Blocked reports that the group waits for an operator: a blocking
	// dead letter or a pause.
	Blocked bool `json:"blocked"`
}

// Groups is the answer of GET api/groups.
type Groups struct {
	Groups   []Group `json:"groups"`
	Scanned  int     `json:"scanned"`
	Complete bool    `json:"complete"`
}

type groupKey struct{ tenant, topic, group string }

// groups lists the groups with waiting messages or a blocking dead letter.
func (h *Handler) groups(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "blocked", "topic", "tenant") {
		return
	}
	q := r.URL.Query()
	onlyBlocked := q.Get("blocked") == "true"
	if v := q.Get("blocked"); v != "" && v != "true" && v != "false" {
		h.fail(w, r, outbox.InvalidParam("blocked", "must be true or false"))
		return
	}
	base := outbox.MessageFilter{Topic: q.Get("topic"), Tenants: q["tenant"]}
	if err := base.Validate(); err != nil {
		h.fail(w, r, err)
		return
	}
	pauses, err := h.admin.PauseList(r.Context(), outbox.PauseListParams{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	now := h.cfg.Clock.Now()
	byKey := map[groupKey]*Group{}
	get := func(m outbox.Message) *Group {
		k := groupKey{m.Tenant, m.Topic, m.Group}
		g := byKey[k]
		if g == nil {
			g = &Group{Tenant: m.Tenant, Topic: m.Topic, Group: m.Group}
			byKey[k] = g
		}
		return g
	}
	out := Groups{Complete: true}
	// Blocking dead letters first: they hold their group whatever follows.
	blocking := base
	blocking.Status, blocking.BlocksGroup = outbox.StatusFailed, true
	for _, st := range []outbox.Status{outbox.StatusFailed, outbox.StatusProcessing, outbox.StatusPending} {
		f := base
		f.Status = st
		if st == outbox.StatusFailed {
			f = blocking
		}
		n, complete, err := h.scan(r.Context(), f, h.cfg.ScanLimit-out.Scanned, func(m outbox.Message) bool {
			if m.Group == "" {
				return true
			}
			g := get(m)
			if st == outbox.StatusFailed {
				if g.DeadLetter == nil {
					dl := NewMessage(m)
					g.DeadLetter = &dl
				}
				return true
			}
			g.Waiting++
			if g.Head == nil || m.Seq < g.Head.Seq {
				head := NewMessage(m)
				g.Head = &head
			}
			return true
		})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		out.Scanned += n
		out.Complete = out.Complete && complete
	}
	out.Groups = []Group{}
	for _, g := range byKey {
		probe := outbox.Message{Tenant: g.Tenant, Topic: g.Topic, Group: g.Group}
		paused := slices.ContainsFunc(pauses, func(p outbox.Pause) bool { return p.Matches(&probe) })
		switch {
		case g.DeadLetter != nil:
			g.HeldBy, g.Blocked = "dead_letter", true
		case paused:
			g.HeldBy, g.Blocked = "pause", true
		case g.Head != nil && g.Head.Status == outbox.StatusProcessing:
			g.HeldBy = "in_flight"
		case g.Head != nil && g.Head.NextAttemptAt.After(now):
			g.HeldBy = "retry"
			at := g.Head.NextAttemptAt
			g.RetryAt = &at
		}
		if onlyBlocked && !g.Blocked {
			continue
		}
		out.Groups = append(out.Groups, *g)
	}
	sort.Slice(out.Groups, func(i, j int) bool {
		a, b := out.Groups[i], out.Groups[j]
		switch {
		case a.Blocked != b.Blocked:
			return a.Blocked
		case a.Topic != b.Topic:
			return a.Topic < b.Topic
		case a.Group != b.Group:
			return a.Group < b.Group
		}
		return a.Tenant < b.Tenant
	})
	writeJSON(w, http.StatusOK, out)
}

// ProcessorView is one processor in GET api/processors.
type ProcessorView struct {
	ID string `json:"id"`
	// Local reports a processor of this process (Config.Processors), whose
	// health and progress are known; others are known by their leases.
	Local               bool       `json:"local"`
	Running             bool       `json:"running"`
	Healthy             bool       `json:"healthy"`
	Error               string     `json:"error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures,omitempty"`
	Since               *time.Time `json:"since,omitempty"`
	InFlight            int64      `json:"in_flight"`
	Claimed             int64      `json:"claimed"`
	Sent                int64      `json:"sent"`
	Retried             int64      `json:"retried"`
	DeadLettered        int64      `json:"dead_lettered"`
	Released            int64      `json:"released"`
	// Unrouted lists the topics with due messages this processor does not
	// claim.
	Unrouted []string `json:"unrouted,omitempty"`
	// Leases counts the PROCESSING messages the store shows claimed by
	// this processor; OldestLeaseAt is the oldest claim's time.
	Leases        int        `json:"leases"`
	OldestLeaseAt *time.Time `json:"oldest_lease_at,omitempty"`
}

// Processors is the answer of GET api/processors.
type Processors struct {
	Processors []ProcessorView `json:"processors"`
	Complete   bool            `json:"complete"`
}

func (h *Handler) processorViews(ctx context.Context) (Processors, error) {
	out := Processors{Processors: []ProcessorView{}}
	idx := map[string]int{}
	for _, p := range h.cfg.Processors {
		hl, pr := p.Health(), p.Progress()
		v := ProcessorView{ID: p.ID(), Local: true, Running: hl.Running, Healthy: hl.Healthy,
			ConsecutiveFailures: hl.ConsecutiveFailures, Since: optTime(hl.Since), InFlight: pr.InFlight,
			Claimed: pr.Claimed, Sent: pr.Sent, Retried: pr.Retried, DeadLettered: pr.DeadLettered, Released: pr.Released}
		if hl.Err != nil {
			// The kind of failure, not its text: a driver's error may
			// carry a DSN.
			v.Error = "store calls failing"
		}
		for _, u := range pr.Unrouted {
			v.Unrouted = append(v.Unrouted, u.Topic)
		}
		idx[v.ID] = len(out.Processors)
		out.Processors = append(out.Processors, v)
	}
	_, complete, err := h.scan(ctx, outbox.MessageFilter{Status: outbox.StatusProcessing}, h.cfg.ScanLimit, func(m outbox.Message) bool {
		i, ok := idx[m.ClaimedBy]
		if !ok {
			i = len(out.Processors)
			idx[m.ClaimedBy] = i
			out.Processors = append(out.Processors, ProcessorView{ID: m.ClaimedBy, Running: true})
		}
		v := &out.Processors[i]
		v.Leases++
		if !m.ClaimedAt.IsZero() && (v.OldestLeaseAt == nil || m.ClaimedAt.Before(*v.OldestLeaseAt)) {
			at := m.ClaimedAt
			v.OldestLeaseAt = &at
		}
		return true
	})
	out.Complete = complete
	return out, err
}

func (h *Handler) processors(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	out, err := h.processorViews(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// Minute is one minute of GET api/activity.
type Minute struct {
	At        time.Time `json:"at"`
	Enqueued  int       `json:"enqueued"`
	Published int       `json:"published"`
	Failed    int       `json:"failed"`
	// LatencyP50Ms and LatencyMaxMs are the commit-to-publish latencies
	// (SentAt - CreatedAt) of the messages published in the minute.
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyMaxMs float64 `json:"latency_max_ms"`
}

// Activity is the answer of GET api/activity: the last hour, minute by
// minute, from the messages created in it (a message created earlier and
// published in the hour is not counted).
type Activity struct {
	Minutes  []Minute `json:"minutes"`
	Scanned  int      `json:"scanned"`
	Complete bool     `json:"complete"`
}

func (h *Handler) activity(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	now := h.cfg.Clock.Now().UTC()
	end := now.Truncate(time.Minute).Add(time.Minute)
	start := end.Add(-60 * time.Minute)
	out := Activity{Minutes: make([]Minute, 60)}
	lat := make([][]float64, 60)
	for i := range out.Minutes {
		out.Minutes[i].At = start.Add(time.Duration(i) * time.Minute)
	}
	slot := func(t time.Time) int {
		if t.Before(start) || !t.Before(end) {
			return -1
		}
		return int(t.Sub(start) / time.Minute)
	}
	var err error
	out.Scanned, out.Complete, err = h.scan(r.Context(), outbox.MessageFilter{CreatedAfter: start}, h.cfg.ScanLimit, func(m outbox.Message) bool {
		if i := slot(m.CreatedAt); i >= 0 {
			out.Minutes[i].Enqueued++
		}
		if i := slot(m.SentAt); i >= 0 && !m.SentAt.IsZero() {
			out.Minutes[i].Published++
			lat[i] = append(lat[i], float64(m.SentAt.Sub(m.CreatedAt).Microseconds())/1000)
		}
		if i := slot(m.UpdatedAt); i >= 0 && m.Status == outbox.StatusFailed {
			out.Minutes[i].Failed++
		}
		return true
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for i, l := range lat {
		if len(l) == 0 {
			continue
		}
		slices.Sort(l)
		out.Minutes[i].LatencyP50Ms, out.Minutes[i].LatencyMaxMs = max(l[len(l)/2], 0), max(l[len(l)-1], 0)
	}
	writeJSON(w, http.StatusOK, out)
}

// Warning is one thing an operator should look at, in GET api/stats.
type Warning struct {
	// Kind is "unclaimed_topic", "old_pending", "horizon_held" or
	// "blocked_groups".
	Kind    string `json:"kind"`
	Topic   string `json:"topic,omitempty"`
	Message string `json:"message"`
}

// warnings lists what an operator should look at: topics no local
// processor claims, an oldest pending message older than
// Config.PendingAgeWarning, a held cleanup horizon, blocked groups.
func (h *Handler) warnings(ctx context.Context, topics []TopicStat, storage *Storage) ([]Warning, error) {
	out := []Warning{}
	if len(h.cfg.Processors) > 0 {
		count := map[string]int{}
		for _, p := range h.cfg.Processors {
			for _, u := range p.Progress().Unrouted {
				count[u.Topic]++
			}
		}
		for topic, n := range count {
			if n == len(h.cfg.Processors) {
				out = append(out, Warning{Kind: "unclaimed_topic", Topic: topic,
					Message: "topic " + topic + " has due messages that no processor claims"})
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	}
	for _, t := range topics {
		if age := time.Duration(t.OldestPendingAgeSeconds * float64(time.Second)); age > h.cfg.PendingAgeWarning {
			out = append(out, Warning{Kind: "old_pending", Topic: t.Topic,
				Message: "the oldest pending message of " + t.Topic + " waits for " + age.Round(time.Second).String() +
					" (over " + h.cfg.PendingAgeWarning.String() + ")"})
		}
	}
	if storage != nil && storage.Horizon.Holder != "" {
		out = append(out, Warning{Kind: "horizon_held",
			Message: "the cleanup horizon is held by " + storage.Horizon.Holder + ": dead rows accumulate and claims slow down"})
	}
	page, err := h.admin.MessageSearch(ctx, outbox.MessageSearchParams{
		Filter: outbox.MessageFilter{Status: outbox.StatusFailed, BlocksGroup: true}, Limit: 1000})
	if err != nil {
		return nil, err
	}
	if n := len(page.Messages); n > 0 {
		what := "1 group is held by a dead letter"
		if n > 1 {
			what = strconv.Itoa(n) + " groups are held by dead letters"
			if page.NextAfterSeq != 0 {
				what = "more than " + what
			}
		}
		out = append(out, Warning{Kind: "blocked_groups", Message: what + " (requeue or cancel to release)"})
	}
	return out, nil
}
