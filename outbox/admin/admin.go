// Package admin is the operator's side of outboxkit: an http.Handler with a
// JSON API and a dashboard (its assets embedded: no CDN, works offline) over
// a store that implements outbox.Admin.
//
// The host mounts it behind its own authentication, supplied as a hook:
//
//	h, err := admin.New(admin.Config{
//		Store:     store,
//		Authorize: func(r *http.Request) error { return checkOperator(r) },
//	})
//	mux.Handle("/outbox/", http.StripPrefix("/outbox", h))
//
// The console is at /outbox/: warnings, pictures of the last hour's
// throughput and latency and of queue depth, counts per topic with pause
// and resume, the messages of each state with filters, search, selection
// and bulk requeue or cancel (a dry-run count first), a page per message
// (its history, payload, attempts and trace ID), the groups and what holds
// them (a dead letter under the block policy, outbox.DeadLetterBlock, a
// pause, a retry), the processors and their leases, the storage report
// when the store has one (outbox.StorageReporter), and the databases of
// the fleet the host runs (Config.Fleet). The API, under /outbox/api/:
//
//	GET    api/stats                       counts by status and oldest pending age per topic, pauses, warnings,
//	                                       and the storage report when the store has one (outbox.StorageReporter)
//	GET    api/messages?FILTER             messages of every tenant, paged (after_seq, limit)
//	GET    api/messages/{id}?tenant=T      one message with its attempts
//	POST   api/messages/{id}/requeue?tenant=T   a FAILED message back to PENDING
//	POST   api/messages/{id}/cancel?tenant=T    a PENDING or FAILED message to CANCELLED
//	POST   api/requeue                     bulk requeue of dead letters: {"filter": {...}, "all": false, "dry_run": true}
//	POST   api/cancel                      bulk cancel of PENDING or FAILED messages: {"filter": {...}, "dry_run": true}
//	GET    api/search?q=Q[&tenant=T]       messages whose ID, idempotency key or provider message ID is Q
//	GET    api/groups[?blocked=true]       groups with waiting messages: their head and what holds them
//	GET    api/processors                  processors: leases held, and health and progress of Config.Processors
//	GET    api/activity                    the last hour per minute: enqueued, published, failed, latency
//	GET    api/fleet[?backlog=true]        the fleet's databases (Config.Fleet): lease owner, epoch and expiry, and
//	                                       for those this instance serves health, progress, last error kind and
//	                                       (backlog=true, one query per database) the due PENDING messages
//	GET    api/pauses                      paused topics and groups
//	POST   api/pauses                      pause: {"topic": "...", "group": "", "tenant": ""}
//	DELETE api/pauses?topic=&group=&tenant=    resume
//
// FILTER is status, topic, group, tenant (repeatable), error_code,
// blocks_group (true: the dead letters that hold their group),
// created_after and created_before (RFC 3339). An unknown parameter, a bad
// value, a bulk requeue with an empty filter and no "all": true, a requeue
// of a message that is not FAILED: a 4xx with {"error": "..."} and nothing
// changed. A request Authorize refuses answers 401 before anything is read.
// Requests that change something must be POST or DELETE with
// Content-Type: application/json, which a cross-site form cannot send.
package admin

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

//go:embed assets
var assets embed.FS

// Config configures a Handler.
type Config struct {
	// Store is the store to operate; it must implement outbox.Admin.
	// Required.
	Store outbox.Store
	// Authorize authenticates every request (a session, a token, mTLS):
	// an error answers 401 and nothing runs. Required: an admin API
	// without authentication is never what a host means.
	Authorize func(r *http.Request) error
	// BasicAuthRealm, when set, makes every 401 carry
	// `WWW-Authenticate: Basic realm="BasicAuthRealm", charset="UTF-8"`,
	// so that a browser asks the operator for a user name and password:
	// set it when Authorize checks HTTP Basic authentication
	// (r.BasicAuth). It must be printable ASCII without a double quote or
	// a backslash. Defaults to "": the 401 carries no challenge (a bearer
	// token or a session cookie is checked).
	BasicAuthRealm string
	// MaxChunks bounds the chunks of one bulk requeue request (each at
	// most "limit", default 500, messages); a larger requeue answers
	// next_after_seq to continue from. Defaults to 20.
	MaxChunks int
	// Processors are the processors running in the host's process, whose
	// health and progress the console shows (*outbox.Processor implements
	// ProcessorReporter). Optional: processors of other processes show
	// through the leases they hold.
	Processors []ProcessorReporter
	// Fleet is the fleet running in the host's process (*outbox.Fleet),
	// whose databases GET api/fleet and the console's Fleet section show:
	// each database's lease (owner, epoch, expiry), and for those this
	// instance serves their processor's health, progress and backlog.
	// Optional.
	Fleet FleetReporter
	// ScanLimit bounds the messages one console view reads (search by
	// idempotency key or provider message ID, groups, processors' leases,
	// the last hour's activity); a view that stops there says it is
	// incomplete. Defaults to 100,000.
	ScanLimit int
	// PendingAgeWarning is the age of a topic's oldest PENDING message over
	// which the console warns. Defaults to 5 minutes.
	PendingAgeWarning time.Duration
	// Logger receives operator actions (requeues, cancels, pauses).
	// Defaults to discarding them.
	Logger *slog.Logger
	// Clock stamps requeues and pauses. Defaults to outbox.SystemClock.
	Clock outbox.Clock
}

// Handler serves the admin API and the dashboard.
type Handler struct {
	cfg   Config
	store outbox.Store
	admin outbox.Admin
	mux   *http.ServeMux
}

// New returns a Handler for cfg, or an error naming what is missing.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil {
		return nil, outbox.InvalidParam("Config.Store", "is required")
	}
	a, ok := cfg.Store.(outbox.Admin)
	if !ok {
		return nil, fmt.Errorf("admin: Config.Store (%T): %w", cfg.Store, outbox.ErrNotAdmin)
	}
	if cfg.Authorize == nil {
		return nil, outbox.InvalidParam("Config.Authorize", "is required (the host's authentication)")
	}
	for _, c := range cfg.BasicAuthRealm {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return nil, outbox.InvalidParam("Config.BasicAuthRealm", "must be printable ASCII without a double quote or a backslash")
		}
	}
	cfg.MaxChunks = cmp.Or(cfg.MaxChunks, 20)
	cfg.ScanLimit = cmp.Or(cfg.ScanLimit, 100_000)
	cfg.PendingAgeWarning = cmp.Or(cfg.PendingAgeWarning, 5*time.Minute)
	if cfg.ScanLimit < 0 {
		return nil, outbox.InvalidParam("Config.ScanLimit", "must not be negative")
	}
	if cfg.PendingAgeWarning < 0 {
		return nil, outbox.InvalidParam("Config.PendingAgeWarning", "must not be negative")
	}
	for i, p := range cfg.Processors {
		if p == nil {
			return nil, outbox.InvalidParam(fmt.Sprintf("Config.Processors[%d]", i), "is nil")
		}
	}
	if cfg.MaxChunks < 0 {
		return nil, outbox.InvalidParam("Config.MaxChunks", "must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = outbox.SystemClock
	}
	h := &Handler{cfg: cfg, store: cfg.Store, admin: a, mux: http.NewServeMux()}
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	h.mux.Handle("GET /{$}", files)
	h.mux.Handle("GET /app.js", files)
	h.mux.Handle("GET /app.css", files)
	h.mux.HandleFunc("GET /api/stats", h.stats)
	h.mux.HandleFunc("GET /api/messages", h.list)
	h.mux.HandleFunc("GET /api/messages/{id}", h.get)
	h.mux.HandleFunc("POST /api/messages/{id}/requeue", h.requeue)
	h.mux.HandleFunc("POST /api/messages/{id}/cancel", h.cancel)
	h.mux.HandleFunc("POST /api/requeue", h.requeueMany)
	h.mux.HandleFunc("GET /api/search", h.search)
	h.mux.HandleFunc("POST /api/cancel", h.cancelMany)
	h.mux.HandleFunc("GET /api/groups", h.groups)
	h.mux.HandleFunc("GET /api/processors", h.processors)
	h.mux.HandleFunc("GET /api/activity", h.activity)
	h.mux.HandleFunc("GET /api/fleet", h.fleet)
	h.mux.HandleFunc("GET /api/pauses", h.pauses)
	h.mux.HandleFunc("POST /api/pauses", h.pause)
	h.mux.HandleFunc("DELETE /api/pauses", h.resume)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not found")
	})
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.cfg.Authorize(r); err != nil {
		if h.cfg.BasicAuthRealm != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="`+h.cfg.BasicAuthRealm+`", charset="UTF-8"`)
		}
		writeError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	if r.Method == http.MethodPost || r.Method == http.MethodDelete {
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			writeError(w, http.StatusUnsupportedMediaType, "requests that change something must send Content-Type: application/json")
			return
		}
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	if !strings.HasPrefix(r.URL.Path, "/api/") {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	}
	h.mux.ServeHTTP(w, r)
}

type apiError struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// fail maps a store error to a status: invalid input 400, not found 404,
// an invalid transition 409, anything else 500 (logged, not echoed).
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ve *outbox.ValidationError
	switch {
	case errors.As(err, &ve):
		writeError(w, http.StatusBadRequest, ve.Error())
	case errors.Is(err, outbox.ErrInvalidInput):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, outbox.ErrNotFound):
		writeError(w, http.StatusNotFound, "message not found")
	case errors.Is(err, outbox.ErrInvalidTransition):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, "request cancelled")
	default:
		h.cfg.Logger.ErrorContext(r.Context(), "outbox admin: store error", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "store error")
	}
}

// TopicStat is the JSON form of an outbox.TopicStat.
type TopicStat struct {
	Topic                   string                  `json:"topic"`
	Counts                  map[outbox.Status]int64 `json:"counts"`
	OldestPendingAt         *time.Time              `json:"oldest_pending_at,omitempty"`
	OldestPendingAgeSeconds float64                 `json:"oldest_pending_age_seconds"`
}

// Pause is the JSON form of an outbox.Pause.
type Pause struct {
	Topic     string     `json:"topic"`
	Group     string     `json:"group"`
	Tenant    string     `json:"tenant"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

// Stats is the answer of GET api/stats.
type Stats struct {
	Topics []TopicStat             `json:"topics"`
	Totals map[outbox.Status]int64 `json:"totals"`
	Pauses []Pause                 `json:"pauses"`
	// Storage is set when the store implements outbox.StorageReporter.
	Storage *Storage `json:"storage,omitempty"`
	// Warnings are what an operator should look at (see Warning).
	Warnings []Warning `json:"warnings"`
	// Fleet reports that Config.Fleet is set: GET api/fleet answers.
	Fleet bool      `json:"fleet"`
	Now   time.Time `json:"now"`
}

// Storage is the JSON form of an outbox.StorageStats.
type Storage struct {
	Tables  []TableStorage `json:"tables"`
	Horizon struct {
		AgeTransactions int64  `json:"age_transactions"`
		Holder          string `json:"holder,omitempty"`
	} `json:"horizon"`
}

// TableStorage is the JSON form of an outbox.TableStorage.
type TableStorage struct {
	Name        string     `json:"name"`
	LiveRows    int64      `json:"live_rows"`
	DeadRows    int64      `json:"dead_rows"`
	LastCleanup *time.Time `json:"last_cleanup,omitempty"`
}

func (h *Handler) stats(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	stats, err := h.admin.TopicStats(r.Context(), outbox.TopicStatsParams{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	pauses, err := h.admin.PauseList(r.Context(), outbox.PauseListParams{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	now := h.cfg.Clock.Now()
	out := Stats{Topics: []TopicStat{}, Totals: map[outbox.Status]int64{}, Pauses: pausesJSON(pauses), Fleet: h.cfg.Fleet != nil, Now: now}
	for _, st := range outbox.Statuses() {
		out.Totals[st] = 0
	}
	for _, s := range stats {
		out.Topics = append(out.Topics, TopicStat{
			Topic: s.Topic, Counts: s.Counts, OldestPendingAt: optTime(s.OldestPendingAt),
			OldestPendingAgeSeconds: s.OldestPendingAge(now).Seconds(),
		})
		for st, n := range s.Counts {
			out.Totals[st] += n
		}
	}
	if sr, ok := h.store.(outbox.StorageReporter); ok {
		st, err := sr.StorageStats(r.Context())
		if err != nil {
			h.fail(w, r, err)
			return
		}
		out.Storage = &Storage{Tables: []TableStorage{}}
		for _, t := range st.Tables {
			out.Storage.Tables = append(out.Storage.Tables, TableStorage{Name: t.Name, LiveRows: t.LiveRows, DeadRows: t.DeadRows, LastCleanup: optTime(t.LastCleanup)})
		}
		out.Storage.Horizon.AgeTransactions, out.Storage.Horizon.Holder = st.Horizon.AgeTransactions, st.Horizon.Holder
	}
	if out.Warnings, err = h.warnings(r.Context(), out.Topics, out.Storage); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func pausesJSON(ps []outbox.Pause) []Pause {
	out := make([]Pause, 0, len(ps))
	for _, p := range ps {
		out = append(out, Pause{Topic: p.Topic, Group: p.Group, Tenant: p.Tenant, CreatedAt: optTime(p.CreatedAt)})
	}
	return out
}

// onlyParams answers 400 when the query has a parameter not in allowed.
func onlyParams(w http.ResponseWriter, r *http.Request, allowed ...string) bool {
	for k := range r.URL.Query() {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q", k))
			return false
		}
	}
	return true
}

// Filter is the JSON form of an outbox.MessageFilter (and the query
// parameters of GET api/messages).
type Filter struct {
	Tenants       []string      `json:"tenants,omitempty"`
	Status        outbox.Status `json:"status,omitempty"`
	Topic         string        `json:"topic,omitempty"`
	Group         string        `json:"group,omitempty"`
	ErrorCode     string        `json:"error_code,omitempty"`
	CreatedAfter  time.Time     `json:"created_after,omitzero"`
	CreatedBefore time.Time     `json:"created_before,omitzero"`
	// BlocksGroup selects the dead letters that hold their group.
	BlocksGroup bool `json:"blocks_group,omitempty"`
}

func (f Filter) filter() outbox.MessageFilter {
	return outbox.MessageFilter{
		Tenants: f.Tenants, Status: f.Status, Topic: f.Topic, Group: f.Group, ErrorCode: f.ErrorCode,
		CreatedAfter: f.CreatedAfter, CreatedBefore: f.CreatedBefore, BlocksGroup: f.BlocksGroup,
	}
}

var filterParams = []string{"tenant", "status", "topic", "group", "error_code", "created_after", "created_before", "blocks_group"}

// queryFilter reads a filter from query parameters.
func queryFilter(q url.Values) (outbox.MessageFilter, error) {
	f := outbox.MessageFilter{
		Tenants: q["tenant"], Status: outbox.Status(strings.ToUpper(q.Get("status"))),
		Topic: q.Get("topic"), Group: q.Get("group"), ErrorCode: q.Get("error_code"),
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"created_after", &f.CreatedAfter}, {"created_before", &f.CreatedBefore}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, outbox.InvalidParam(p.name, "must be an RFC 3339 time")
			}
			*p.dst = t
		}
	}
	switch q.Get("blocks_group") {
	case "", "false":
	case "true":
		f.BlocksGroup = true
	default:
		return f, outbox.InvalidParam("blocks_group", "must be true or false")
	}
	return f, f.Validate()
}

func intParam(q url.Values, name string) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, outbox.InvalidParam(name, "must be a non-negative integer")
	}
	return n, nil
}

// Page is the answer of GET api/messages.
type Page struct {
	Messages     []Message `json:"messages"`
	NextAfterSeq int64     `json:"next_after_seq"`
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, append([]string{"after_seq", "limit"}, filterParams...)...) {
		return
	}
	q := r.URL.Query()
	f, err := queryFilter(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	after, err := intParam(q, "after_seq")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	limit, err := intParam(q, "limit")
	if err != nil || limit > 1000 {
		h.fail(w, r, outbox.InvalidParam("limit", "must be between 0 and 1000"))
		return
	}
	page, err := h.admin.MessageSearch(r.Context(), outbox.MessageSearchParams{Filter: f, AfterSeq: after, Limit: int(limit)})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := Page{Messages: make([]Message, 0, len(page.Messages)), NextAfterSeq: page.NextAfterSeq}
	for _, m := range page.Messages {
		out.Messages = append(out.Messages, NewMessage(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// Detail is the answer of GET api/messages/{id}.
type Detail struct {
	Message  Message   `json:"message"`
	Attempts []Attempt `json:"attempts"`
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "tenant") {
		return
	}
	tenant, id := r.URL.Query().Get("tenant"), r.PathValue("id")
	m, err := h.store.MessageGet(r.Context(), outbox.MessageGetParams{Tenant: tenant, ID: id})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	atts, err := h.store.AttemptList(r.Context(), outbox.AttemptListParams{Tenant: tenant, MessageID: id})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := Detail{Message: NewMessage(m), Attempts: make([]Attempt, 0, len(atts))}
	for _, a := range atts {
		out.Attempts = append(out.Attempts, NewAttempt(a))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) requeue(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "tenant") {
		return
	}
	tenant, id := r.URL.Query().Get("tenant"), r.PathValue("id")
	m, err := h.store.MessageRequeue(r.Context(), outbox.MessageRequeueParams{Tenant: tenant, ID: id, Now: h.cfg.Clock.Now()})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "outbox admin: message requeued", "tenant", tenant, "id", id)
	writeJSON(w, http.StatusOK, NewMessage(m))
}

func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "tenant") {
		return
	}
	tenant, id := r.URL.Query().Get("tenant"), r.PathValue("id")
	m, err := h.store.MessageCancel(r.Context(), outbox.MessageCancelParams{Tenant: tenant, ID: id, Now: h.cfg.Clock.Now()})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "outbox admin: message cancelled", "tenant", tenant, "id", id)
	writeJSON(w, http.StatusOK, NewMessage(m))
}

// RequeueRequest is the body of POST api/requeue.
type RequeueRequest struct {
	Filter Filter `json:"filter"`
	// All must be true to requeue every dead letter (an empty filter).
	All    bool `json:"all"`
	DryRun bool `json:"dry_run"`
	// AfterSeq continues an earlier request (its next_after_seq).
	AfterSeq int64 `json:"after_seq"`
	// Limit is the chunk size (default 500, at most 1000).
	Limit int `json:"limit"`
}

// RequeueResponse is the answer of POST api/requeue.
type RequeueResponse struct {
	Matched  int  `json:"matched"`
	Requeued int  `json:"requeued"`
	DryRun   bool `json:"dry_run"`
	// NextAfterSeq is 0 when every match was handled; otherwise send the
	// request again with after_seq set to it.
	NextAfterSeq int64 `json:"next_after_seq"`
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return outbox.InvalidParam("body", "is not the expected JSON: "+err.Error())
	}
	return nil
}

func (h *Handler) requeueMany(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	var req RequeueRequest
	if err := decodeBody(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	p := outbox.MessageRequeueManyParams{
		Filter: req.Filter.filter(), All: req.All, DryRun: req.DryRun, AfterSeq: req.AfterSeq, Limit: req.Limit,
		Now: h.cfg.Clock.Now(),
	}
	// Validate once before the first chunk, so that a bad request changes
	// nothing.
	check := p
	if err := check.Prepare(); err != nil {
		h.fail(w, r, err)
		return
	}
	out := RequeueResponse{DryRun: req.DryRun}
	for range h.cfg.MaxChunks {
		res, err := h.admin.MessageRequeueMany(r.Context(), p)
		if err != nil {
			if out.Requeued > 0 {
				h.cfg.Logger.WarnContext(r.Context(), "outbox admin: bulk requeue stopped", "requeued", out.Requeued, "after_seq", p.AfterSeq, "err", err)
			}
			h.fail(w, r, err)
			return
		}
		out.Matched += res.Matched
		out.Requeued += res.Requeued
		out.NextAfterSeq = res.NextAfterSeq
		if res.NextAfterSeq == 0 {
			break
		}
		p.AfterSeq = res.NextAfterSeq
	}
	if out.Requeued > 0 {
		h.cfg.Logger.InfoContext(r.Context(), "outbox admin: dead letters requeued", "requeued", out.Requeued, "next_after_seq", out.NextAfterSeq)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) pauses(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	ps, err := h.admin.PauseList(r.Context(), outbox.PauseListParams{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, pausesJSON(ps))
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r) {
		return
	}
	var p Pause
	if err := decodeBody(r, &p); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.admin.PauseAdd(r.Context(), outbox.PauseAddParams{Topic: p.Topic, Group: p.Group, Tenant: p.Tenant, Now: h.cfg.Clock.Now()}); err != nil {
		h.fail(w, r, err)
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "outbox admin: paused", "topic", p.Topic, "group", p.Group, "tenant", p.Tenant)
	writeJSON(w, http.StatusOK, p)
}

func (h *Handler) resume(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "topic", "group", "tenant") {
		return
	}
	q := r.URL.Query()
	ok, err := h.admin.PauseRemove(r.Context(), outbox.PauseRemoveParams{Topic: q.Get("topic"), Group: q.Get("group"), Tenant: q.Get("tenant")})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !ok {
		writeError(w, http.StatusNotFound, "no such pause")
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "outbox admin: resumed", "topic", q.Get("topic"), "group", q.Get("group"), "tenant", q.Get("tenant"))
	writeJSON(w, http.StatusOK, Pause{Topic: q.Get("topic"), Group: q.Get("group"), Tenant: q.Get("tenant")})
}
