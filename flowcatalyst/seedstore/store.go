// Package seedstore is an outbox.Store over the outbox tables of seed 004
// (the FlowCatalyst outbox processor) in PostgreSQL: outbox_events and
// outbox_dispatch_jobs, exactly as the seed defines them and as
// applications in any language write them, so that outboxkit's processor
// can replace the seed's.
//
//	CREATE TABLE outbox_events (
//	    id VARCHAR(13) PRIMARY KEY,       -- a TSID
//	    type VARCHAR(20) NOT NULL,        -- EVENT or DISPATCH_JOB
//	    message_group VARCHAR(255),       -- FIFO key, NULL = unordered
//	    payload TEXT NOT NULL,            -- the JSON item
//	    status VARCHAR(20) NOT NULL,      -- PENDING, PROCESSING, COMPLETED, FAILED
//	    retry_count INT NOT NULL DEFAULT 0,
//	    created_at TIMESTAMP NOT NULL,
//	    processed_at TIMESTAMP,
//	    error_message TEXT
//	);
//
// # Mapping
//
// The table decides the topic: rows of the events table are messages of
// topic flowcatalyst.TopicEvent, rows of the dispatch-jobs table of
// flowcatalyst.TopicDispatchJob. message_group is the group (NULL or ”
// means unordered), payload the Payload (sent verbatim; a payload that is
// not JSON fails permanently), created_at the CreatedAt and the order of a
// group (ties broken by id), COMPLETED is outbox's SENT. Every message has
// tenant "". Attempts is retry_count + 1 while a row is PROCESSING.
//
// The seed's columns are used as the seed uses them, plus one convention:
//
//   - processed_at of a PROCESSING row is the claim time (the lease); of a
//     COMPLETED or FAILED row the time it finished, as in the seed;
//   - processed_at of a PENDING row, when set, is the time it may be retried
//     (the backoff); applications insert rows with processed_at NULL (due at
//     once). A seed processor running alongside simply ignores the delay;
//   - retry_count counts failed attempts (a retry and a recovered lease add
//     one; a dead letter leaves it, as in the seed); error_message holds the
//     last error as "code: message".
//
// # FIFO
//
// Claims keep FIFO per (table, message_group) with any number of processors:
// a row is claimed only when every earlier unfinished row of its group
// (PENDING, including one waiting for a retry, or PROCESSING) is claimed in
// the same statement. Claims use FOR UPDATE SKIP LOCKED, so claimers never
// wait for each other.
//
// # Limits
//
// The seed tables have no owner column, no attempt history, no receipt and
// no CANCELLED status: AttemptList returns no attempts, MessageApplyReceipt
// returns outbox.ErrNotFound, MessageCancel returns errors.ErrUnsupported.
// Outcomes are fenced by the claim time (processed_at), which the Store
// remembers for the rows it claimed: outcomes must be recorded through the
// Store that claimed (the processor does this). Seq is the id's TSID value
// (0 for an id that is not a TSID); MessageList pages by it.
package seedstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// DB is what the Store needs of a database handle; *sql.DB has it. The
// driver must be PostgreSQL's (e.g. github.com/jackc/pgx/v5/stdlib) and
// accept Go slices as array parameters.
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Default table names, as in seed 004.
const (
	DefaultEventsTable       = "outbox_events"
	DefaultDispatchJobsTable = "outbox_dispatch_jobs"
)

// Seed statuses.
const (
	StatusPending    = "PENDING"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Options configures a Store.
type Options struct {
	// EventsTable is the table of EVENT items, optionally schema-qualified
	// ("app.outbox_events"). Defaults to "outbox_events".
	EventsTable string
	// DispatchJobsTable is the table of DISPATCH_JOB items. Defaults to
	// "outbox_dispatch_jobs".
	DispatchJobsTable string
	// Logger defaults to discarding.
	Logger *slog.Logger
}

type table struct {
	topic string
	name  string // quoted, possibly qualified
	raw   string
	sql   statements
}

// Store is an outbox.Store over seed 004's tables. It is safe for
// concurrent use.
type Store struct {
	db     DB
	tables []*table // events, dispatch jobs
	log    *slog.Logger

	mu     sync.Mutex
	leases map[leaseKey]lease
	turn   int
}

type leaseKey struct{ topic, id string }

type lease struct {
	claimedAt time.Time
	attempt   int
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

func quoteIdent(name string) (string, error) {
	if !identRE.MatchString(name) {
		return "", fmt.Errorf("%q is not a table name (letters, digits and _, optionally schema.table)", name)
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, "."), nil
}

// New returns a Store over db. It does not touch the database; see
// CreateTables.
func New(db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if opts.EventsTable == "" {
		opts.EventsTable = DefaultEventsTable
	}
	if opts.DispatchJobsTable == "" {
		opts.DispatchJobsTable = DefaultDispatchJobsTable
	}
	if strings.EqualFold(opts.EventsTable, opts.DispatchJobsTable) {
		return nil, outbox.InvalidParam("Options.DispatchJobsTable", "must differ from EventsTable")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{db: db, log: opts.Logger, leases: map[leaseKey]lease{}}
	for _, t := range []struct{ topic, name, field string }{
		{flowcatalyst.TopicEvent, opts.EventsTable, "Options.EventsTable"},
		{flowcatalyst.TopicDispatchJob, opts.DispatchJobsTable, "Options.DispatchJobsTable"},
	} {
		q, err := quoteIdent(t.name)
		if err != nil {
			return nil, outbox.InvalidParam(t.field, err.Error())
		}
		s.tables = append(s.tables, &table{topic: t.topic, name: q, raw: t.name, sql: buildStatements(q)})
	}
	return s, nil
}

// Topics returns the topics of the two tables.
func (s *Store) Topics() []string {
	return []string{s.tables[0].topic, s.tables[1].topic}
}

// CreateTables creates the two tables and their indexes, as seed 004
// defines them, when they do not exist yet.
func (s *Store) CreateTables(ctx context.Context) error {
	for _, t := range s.tables {
		idx := "idx_" + strings.ReplaceAll(t.raw, ".", "_") + "_status"
		if i := strings.LastIndex(t.raw, "."); i >= 0 {
			idx = "idx_" + t.raw[i+1:] + "_status"
		}
		ddl := `CREATE TABLE IF NOT EXISTS ` + t.name + ` (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
);
CREATE INDEX IF NOT EXISTS "` + idx + `" ON ` + t.name + `(status, message_group, created_at)`
		for _, stmt := range strings.Split(ddl, ";\n") {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("seedstore: create %s: %w", t.raw, err)
			}
		}
	}
	return nil
}

func (s *Store) tablesFor(topics []string) ([]*table, error) {
	if len(topics) == 0 {
		return s.tables, nil
	}
	var out []*table
	for _, t := range s.tables {
		for _, want := range topics {
			if want == "" {
				return nil, outbox.InvalidParam("Topics", "contains an empty topic")
			}
			if want == t.topic {
				out = append(out, t)
				break
			}
		}
	}
	return out, nil
}

func (s *Store) tableOf(topic string) *table {
	for _, t := range s.tables {
		if t.topic == topic {
			return t
		}
	}
	return nil
}

// at returns t as the store writes it: UTC, truncated to the microsecond
// (TIMESTAMP's precision), so a fence compares equal.
func at(t time.Time) time.Time {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// MaxClaimLimit is the largest MessageClaimParams.Limit the store accepts.
const MaxClaimLimit = 10000

// MessageClaim leases up to p.Limit due rows: status PROCESSING,
// processed_at = p.Now. It shares the limit between the tables (taking
// turns to start, so neither starves) and returns the rows ordered by
// table, then created_at and id.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 || p.Limit > MaxClaimLimit {
		return nil, outbox.InvalidParam("Limit", fmt.Sprintf("must be between 1 and %d", MaxClaimLimit))
	}
	if p.Owner == "" {
		return nil, outbox.InvalidParam("Owner", "is required")
	}
	tables, err := s.tablesFor(p.Topics)
	if err != nil || len(tables) == 0 {
		return nil, err
	}
	now := at(p.Now)
	s.mu.Lock()
	s.turn++
	first := s.turn % len(tables)
	s.mu.Unlock()
	order := append(append([]*table{}, tables[first:]...), tables[:first]...)

	var out []outbox.Message
	remaining := p.Limit
	for i, t := range order {
		limit := remaining
		if i < len(order)-1 {
			limit = max(remaining/(len(order)-i), 1)
		}
		msgs, err := s.claim(ctx, t, limit, now, p.Owner)
		if err != nil {
			if len(out) > 0 {
				// Rows already claimed are committed: hand them out.
				s.log.WarnContext(ctx, "seedstore: claim failed", "table", t.raw, "err", err)
				break
			}
			return nil, err
		}
		out = append(out, msgs...)
		remaining = p.Limit - len(out)
		if remaining == 0 {
			break
		}
	}
	// A second round gives what one table left unused to the other.
	if remaining > 0 && len(order) > 1 && len(out) > 0 {
		for _, t := range order {
			msgs, err := s.claim(ctx, t, remaining, now, p.Owner)
			if err != nil {
				s.log.WarnContext(ctx, "seedstore: claim failed", "table", t.raw, "err", err)
				break
			}
			out = append(out, msgs...)
			remaining = p.Limit - len(out)
			if remaining == 0 {
				break
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic > out[j].Topic // EVENT before DISPATCH_JOB
		}
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (s *Store) claim(ctx context.Context, t *table, limit int, now time.Time, owner string) ([]outbox.Message, error) {
	rows, err := s.db.QueryContext(ctx, t.sql.claim, now, limit)
	if err != nil {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	defer rows.Close()
	var out []outbox.Message
	for rows.Next() {
		var r row
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
		}
		m := r.message(t.topic)
		m.ClaimedAt, m.ClaimedBy, m.UpdatedAt = now, owner, now
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	s.mu.Lock()
	for _, m := range out {
		s.leases[leaseKey{t.topic, m.ID}] = lease{claimedAt: now, attempt: m.Attempts}
	}
	s.mu.Unlock()
	return out, nil
}

// row is one row of a seed table.
type row struct {
	id, typ      string
	group        sql.NullString
	payload      string
	status       string
	retryCount   int
	createdAt    time.Time
	processedAt  sql.NullTime
	errorMessage sql.NullString
}

const columns = `id, type, message_group, payload, status, retry_count, created_at, processed_at, error_message`

func (r *row) dest() []any {
	return []any{&r.id, &r.typ, &r.group, &r.payload, &r.status, &r.retryCount, &r.createdAt, &r.processedAt, &r.errorMessage}
}

func (r *row) message(topic string) outbox.Message {
	m := outbox.Message{
		ID: r.id, Topic: topic, Group: r.group.String, Payload: []byte(r.payload),
		CreatedAt: r.createdAt.UTC(), UpdatedAt: r.createdAt.UTC(),
	}
	if id, err := flowcatalyst.ParseTSID(r.id); err == nil {
		m.Seq = int64(id & (1<<63 - 1))
	}
	if r.errorMessage.Valid {
		code, msg, ok := strings.Cut(r.errorMessage.String, ": ")
		if !ok || strings.ContainsAny(code, " \t") {
			code, msg = "error", r.errorMessage.String
		}
		m.LastError = &outbox.ErrorInfo{Code: code, Message: msg}
	}
	pa := r.processedAt.Time.UTC()
	switch r.status {
	case StatusPending:
		m.Status = outbox.StatusPending
		m.Attempts = r.retryCount
		m.NextAttemptAt = m.CreatedAt
		if r.processedAt.Valid {
			m.NextAttemptAt = pa
		}
	case StatusProcessing:
		m.Status = outbox.StatusProcessing
		m.Attempts = r.retryCount + 1
		m.ClaimedAt, m.UpdatedAt = pa, pa
	case StatusCompleted:
		m.Status = outbox.StatusSent
		m.Attempts = r.retryCount + 1
		m.SentAt, m.UpdatedAt = pa, pa
	case StatusFailed:
		m.Status = outbox.StatusFailed
		m.Attempts = r.retryCount + 1
		m.UpdatedAt = pa
	default:
		m.Status = outbox.Status(r.status)
	}
	if m.UpdatedAt.IsZero() {
		m.UpdatedAt = m.CreatedAt
	}
	return m
}

func errorText(e outbox.ErrorInfo) string {
	code := strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == ':' {
			return '_'
		}
		return r
	}, e.Code)
	if code == "" {
		code = "error"
	}
	return code + ": " + e.Message
}

// MessageFinish records outcomes in one transaction, fenced by the claim:
// an outcome applies only while its row is PROCESSING with the processed_at
// this Store set when it claimed it (and the same attempt). Outcomes for
// rows this Store did not claim, or whose lease was lost, are returned in
// LeaseLost.
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	now := at(p.Now)
	type batch struct {
		ids     []string
		claimed []time.Time
		next    []time.Time
		retry   []int
		msgs    []string
		deferTo []*time.Time
	}
	type perTable struct{ sent, retry, dead, released batch }
	work := map[*table]*perTable{}
	var res outbox.FinishResult
	var keys []leaseKey
	take := func(id string, attempt int) (*table, time.Time, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range s.tables {
			k := leaseKey{t.topic, id}
			if l, ok := s.leases[k]; ok && l.attempt == attempt {
				keys = append(keys, k)
				return t, l.claimedAt, true
			}
		}
		return nil, time.Time{}, false
	}
	get := func(t *table) *perTable {
		if work[t] == nil {
			work[t] = &perTable{}
		}
		return work[t]
	}
	for _, o := range p.Sent {
		t, c, ok := take(o.ID, o.Attempt)
		if !ok {
			res.LeaseLost = append(res.LeaseLost, o.ID)
			continue
		}
		b := &get(t).sent
		b.ids, b.claimed = append(b.ids, o.ID), append(b.claimed, c)
	}
	for _, o := range p.Retry {
		t, c, ok := take(o.ID, o.Attempt)
		if !ok {
			res.LeaseLost = append(res.LeaseLost, o.ID)
			continue
		}
		b := &get(t).retry
		b.ids, b.claimed = append(b.ids, o.ID), append(b.claimed, c)
		b.next = append(b.next, at(o.NextAttemptAt))
		b.retry = append(b.retry, o.Attempt)
		b.msgs = append(b.msgs, errorText(o.Error))
	}
	for _, o := range p.Dead {
		t, c, ok := take(o.ID, o.Attempt)
		if !ok {
			res.LeaseLost = append(res.LeaseLost, o.ID)
			continue
		}
		b := &get(t).dead
		b.ids, b.claimed = append(b.ids, o.ID), append(b.claimed, c)
		b.msgs = append(b.msgs, errorText(o.Error))
	}
	for _, o := range p.Released {
		t, c, ok := take(o.ID, o.Attempt)
		if !ok {
			res.LeaseLost = append(res.LeaseLost, o.ID)
			continue
		}
		b := &get(t).released
		b.ids, b.claimed = append(b.ids, o.ID), append(b.claimed, c)
		// A deferral (quota, throttle) keeps the row PENDING until then; a
		// plain release makes it due at once (processed_at NULL).
		var next *time.Time
		if !o.NextAttemptAt.IsZero() {
			n := at(o.NextAttemptAt)
			next = &n
		}
		b.deferTo = append(b.deferTo, next)
	}
	if len(work) == 0 {
		return res, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("seedstore: finish: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var lost []string
	exec := func(stmt string, b batch, args ...any) error {
		if len(b.ids) == 0 {
			return nil
		}
		rows, err := tx.QueryContext(ctx, stmt, append([]any{b.ids, b.claimed}, args...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		done := map[string]bool{}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			done[id] = true
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range b.ids {
			if !done[id] {
				lost = append(lost, id)
			}
		}
		return nil
	}
	for _, t := range s.tables {
		w := work[t]
		if w == nil {
			continue
		}
		for _, step := range []func() error{
			func() error { return exec(t.sql.finishSent, w.sent, now) },
			func() error { return exec(t.sql.finishRetry, w.retry, w.retry.next, w.retry.retry, w.retry.msgs) },
			func() error { return exec(t.sql.finishDead, w.dead, now, w.dead.msgs) },
			func() error { return exec(t.sql.finishRelease, w.released, w.released.deferTo) },
		} {
			if err := step(); err != nil {
				return outbox.FinishResult{}, fmt.Errorf("seedstore: finish %s: %w", t.raw, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return outbox.FinishResult{}, fmt.Errorf("seedstore: finish: %w", err)
	}
	s.mu.Lock()
	for _, k := range keys {
		delete(s.leases, k)
	}
	s.mu.Unlock()
	res.LeaseLost = append(res.LeaseLost, lost...)
	return res, nil
}

// MessageRecover puts back to PENDING every PROCESSING row whose
// processed_at is before p.ClaimedBefore (its processor died or stalled),
// counting the lost attempt in retry_count, or marks it FAILED when that was
// its last attempt (p.MaxAttempts, which must be positive).
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	if p.MaxAttempts < 1 {
		return outbox.RecoverResult{}, outbox.InvalidParam("MaxAttempts", "must be positive")
	}
	before := at(p.ClaimedBefore)
	now := at(p.Now)
	var res outbox.RecoverResult
	for _, t := range s.tables {
		rows, err := s.db.QueryContext(ctx, t.sql.recover, before, p.MaxAttempts, now,
			errorText(outbox.ErrorInfo{Code: "lease_expired", Message: "the processor did not finish the attempt in time"}))
		if err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
		}
		for rows.Next() {
			var id, status string
			if err := rows.Scan(&id, &status); err != nil {
				rows.Close()
				return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
			}
			if status == StatusFailed {
				res.DeadLettered++
			} else {
				res.Recovered++
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return res, fmt.Errorf("seedstore: recover %s: %w", t.raw, err)
		}
	}
	// Forget leases that expired: their outcomes will be refused anyway.
	s.mu.Lock()
	for k, l := range s.leases {
		if l.claimedAt.Before(before) {
			delete(s.leases, k)
		}
	}
	s.mu.Unlock()
	return res, nil
}

// MessageGet returns one row by id (tenant must be "").
func (s *Store) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.tables {
		rows, err := s.db.QueryContext(ctx, t.sql.get, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
		}
		var r row
		found := rows.Next()
		if found {
			err = rows.Scan(r.dest()...)
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: get: %w", err)
		}
		if found {
			return r.message(t.topic), nil
		}
	}
	return outbox.Message{}, outbox.ErrNotFound
}

// MessageList returns rows ordered by id (a TSID, so by creation), filtered
// by status, topic and group. Pagination (AfterSeq) works for TSID ids.
func (s *Store) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if p.Tenant != "" {
		return outbox.MessagePage{}, nil
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	if limit > 1000 {
		return outbox.MessagePage{}, outbox.InvalidParam("Limit", "must be at most 1000")
	}
	status := ""
	if p.Status != "" {
		var ok bool
		if status, ok = seedStatus(p.Status); !ok {
			return outbox.MessagePage{}, nil
		}
	}
	after := ""
	if p.AfterSeq > 0 {
		after = flowcatalyst.TSID(p.AfterSeq).String()
	}
	var all []outbox.Message
	for _, t := range s.tables {
		if p.Topic != "" && p.Topic != t.topic {
			continue
		}
		rows, err := s.db.QueryContext(ctx, t.sql.list, after, status, p.Group, limit+1)
		if err != nil {
			return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
		}
		for rows.Next() {
			var r row
			if err := rows.Scan(r.dest()...); err != nil {
				rows.Close()
				return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
			}
			all = append(all, r.message(t.topic))
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return outbox.MessagePage{}, fmt.Errorf("seedstore: list: %w", err)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	page := outbox.MessagePage{Messages: all}
	if len(all) > limit {
		page.Messages = all[:limit]
		page.NextAfterSeq = page.Messages[limit-1].Seq
	}
	return page, nil
}

func seedStatus(st outbox.Status) (string, bool) {
	switch st {
	case outbox.StatusPending:
		return StatusPending, true
	case outbox.StatusProcessing:
		return StatusProcessing, true
	case outbox.StatusSent:
		return StatusCompleted, true
	case outbox.StatusFailed:
		return StatusFailed, true
	}
	return "", false
}

// MessageCount counts rows of both tables by status (COMPLETED counts as
// SENT; every outbox status is present).
func (s *Store) MessageCount(ctx context.Context, p outbox.MessageCountParams) (map[outbox.Status]int64, error) {
	out := map[outbox.Status]int64{}
	for _, st := range outbox.Statuses() {
		out[st] = 0
	}
	if p.Tenant != "" && !p.AllTenants {
		return out, nil
	}
	for _, t := range s.tables {
		rows, err := s.db.QueryContext(ctx, t.sql.count)
		if err != nil {
			return nil, fmt.Errorf("seedstore: count: %w", err)
		}
		for rows.Next() {
			var st string
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return nil, fmt.Errorf("seedstore: count: %w", err)
			}
			r := row{status: st}
			out[r.message(t.topic).Status] += n
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("seedstore: count: %w", err)
		}
	}
	return out, nil
}

// MessageRequeue moves a FAILED row back to PENDING, due now, with
// retry_count 0 and no error message.
func (s *Store) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	if p.Tenant != "" {
		return outbox.Message{}, outbox.ErrNotFound
	}
	for _, t := range s.tables {
		res, err := s.db.ExecContext(ctx, t.sql.requeue, p.ID)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("seedstore: requeue: %w", err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			return s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
		}
	}
	m, err := s.MessageGet(ctx, outbox.MessageGetParams{ID: p.ID})
	if err != nil {
		return outbox.Message{}, err
	}
	return outbox.Message{}, fmt.Errorf("seedstore: requeue %s: %w", m.Status, outbox.ErrInvalidTransition)
}

// MessagePrune deletes COMPLETED and FAILED rows finished before p.Before,
// at most p.Limit (default 1000) per table and call.
func (s *Store) MessagePrune(ctx context.Context, p outbox.MessagePruneParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	total := 0
	for _, t := range s.tables {
		res, err := s.db.ExecContext(ctx, t.sql.prune, at(p.Before), limit)
		if err != nil {
			return total, fmt.Errorf("seedstore: prune: %w", err)
		}
		n, _ := res.RowsAffected()
		total += int(n)
	}
	return total, nil
}

// AttemptList returns no attempts: the seed tables keep none. It returns
// outbox.ErrNotFound when the row does not exist.
func (s *Store) AttemptList(ctx context.Context, p outbox.AttemptListParams) ([]outbox.Attempt, error) {
	if _, err := s.MessageGet(ctx, outbox.MessageGetParams{Tenant: p.Tenant, ID: p.MessageID}); err != nil {
		return nil, err
	}
	return nil, nil
}

// MessageApplyReceipt returns outbox.ErrNotFound: FlowCatalyst sends no
// receipts and the seed tables have no provider message id.
func (s *Store) MessageApplyReceipt(context.Context, outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	return outbox.ReceiptResult{}, outbox.ErrNotFound
}

// MessageCancel returns an error matching errors.ErrUnsupported: the seed
// has no CANCELLED status, and writing one would break the seed's readers.
func (s *Store) MessageCancel(context.Context, outbox.MessageCancelParams) (outbox.Message, error) {
	return outbox.Message{}, fmt.Errorf("seedstore: cancel: the seed tables have no CANCELLED status: %w", errors.ErrUnsupported)
}

var _ outbox.Store = (*Store)(nil)
