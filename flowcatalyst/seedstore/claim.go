package seedstore

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// claimTimeout bounds a claim once started.
const claimTimeout = 30 * time.Second

// callerDoneKey carries the caller's Done channel into a claim, which runs
// on a context without cancellation: a claim made of several steps
// (MongoDB) stops at the next step once the caller is gone, handing out
// what it leased so far.
type callerDoneKey struct{}

// callerGone reports whether the caller of the claim running on ctx has
// gone.
func callerGone(ctx context.Context) bool {
	done, _ := ctx.Value(callerDoneKey{}).(<-chan struct{})
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// MessageClaim leases up to p.Limit due rows: status PROCESSING,
// processed_at = the database's NOW() (p.Now is not used). The tables take
// turns to go first (so neither starves), and it returns the rows ordered by
// created_at, then id.
//
// ctx is checked before the claim starts; once started, the claim runs to
// completion (at most 30 s) even if ctx ends, and returns the rows it
// leased.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// A claim commits on the server as it goes: if ctx ended while it ran,
	// the caller would lose rows the server leased (they would wait for
	// recovery). So ctx is checked before the claim starts, and the claim
	// then runs to completion (bounded by claimTimeout) and returns what it
	// leased; the caller releases what it will not send.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	caller := ctx.Done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, callerDoneKey{}, caller)
	tables, err := s.tablesFor(p.Topics)
	if err != nil || len(tables) == 0 {
		return nil, err
	}
	s.mu.Lock()
	first := s.turn % len(tables)
	s.mu.Unlock()
	order := append(append([]*table{}, tables[first:]...), tables[:first]...)

	// The events table goes first, each table taking what the limit leaves
	// (one statement per table and claim). When the first table alone
	// fills the limit, the other goes first next time, so neither starves.
	// MongoDB: "now" is the server's clock, read once per claim.
	var now time.Time
	if s.mg != nil {
		if now, err = s.serverNow(ctx); err != nil {
			return nil, fmt.Errorf("seedstore: claim: %w", err)
		}
	}
	var out []outbox.Message
	cut := false
	for i, t := range order {
		remaining := p.Limit - len(out)
		if remaining == 0 {
			if i == 1 {
				s.mu.Lock()
				s.turn++
				s.mu.Unlock()
			}
			break
		}
		msgs, more, err := s.claim(ctx, t, remaining, p.Owner, now)
		cut = cut || more
		if err != nil {
			if len(out) > 0 {
				// Rows already claimed are committed: hand them out.
				s.log.WarnContext(ctx, "seedstore: claim failed", "table", t.raw, "err", err)
				break
			}
			return nil, err
		}
		if s.mg != nil && !s.mg.claimed.Load() && len(msgs) > 0 && i == 0 {
			// A Store's first claim hands out its first documents at
			// once (see claimPace); the other collection comes next.
			out, cut = append(out, msgs...), true
			s.mu.Lock()
			s.turn++
			s.mu.Unlock()
			break
		}
		out = append(out, msgs...)
	}
	if s.mg != nil && len(out) > 0 {
		s.mg.claimed.Store(true)
	}
	if cut && len(out) < p.Limit {
		s.wakeUp()
	}
	// The order of the groups: created_at, then id (TSIDs follow creation,
	// so this is Seq order for the store's own ids).
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Topic > out[j].Topic // EVENT before DISPATCH_JOB
	})
	return out, nil
}

// claim claims up to limit rows of t. more reports a claim cut short by
// its time budget (MongoDB) with rows left to try.
func (s *Store) claim(ctx context.Context, t *table, limit int, owner string, now time.Time) (msgs []outbox.Message, more bool, err error) {
	if s.mg != nil {
		return s.claimMongo(ctx, t, limit, owner, now)
	}
	msgs, err = s.claimSQL(ctx, t, limit, owner)
	return msgs, false, err
}

func (s *Store) claimSQL(ctx context.Context, t *table, limit int, owner string) ([]outbox.Message, error) {
	if s.mysql {
		return s.claimMySQL(ctx, t, limit, owner)
	}
	out, err := s.claimWith(ctx, t, t.sql.claim, owner, limit, min(limit, s.chunk), !s.unorderedNull)
	if err != nil || !s.unorderedNull || len(out) >= limit {
		return out, err
	}
	more, err := s.claimWith(ctx, t, t.sql.claimUnordered, owner, limit-len(out))
	if err != nil {
		if len(out) > 0 {
			s.log.WarnContext(ctx, "seedstore: claim failed", "table", t.raw, "err", err)
			return out, nil
		}
		return nil, err
	}
	return append(out, more...), nil
}

func (s *Store) claimWith(ctx context.Context, t *table, stmt, owner string, args ...any) ([]outbox.Message, error) {
	rows, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	defer rows.Close()
	var out []outbox.Message
	var claimed []time.Time
	for rows.Next() {
		var r row
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
		}
		m := s.message(&r, t.topic)
		m.ClaimedBy = owner
		out = append(out, m)
		claimed = append(claimed, r.processedAt.Time)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	s.remember(t, out, claimed)
	return out, nil
}

// remember records the leases of rows claimed from t: out[i] was claimed
// at claimed[i], as the database wrote processed_at.
func (s *Store) remember(t *table, out []outbox.Message, claimed []time.Time) {
	s.mu.Lock()
	for i, m := range out {
		s.leaseGen++
		s.leases[leaseKey{t.topic, m.ID}] = lease{claimedAt: claimed[i], attempt: m.Attempts, gen: s.leaseGen}
	}
	s.mu.Unlock()
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

// message maps r to an outbox.Message of topic.
func (s *Store) message(r *row, topic string) outbox.Message {
	m := outbox.Message{
		ID: r.id, Topic: topic, Group: s.groupOf(r.group), Payload: []byte(r.payload),
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

// Wakeups implements outbox.Waker: on MongoDB, a claim that stopped early
// (its time budget on a slow server, or a Store's first claim handing out
// its first documents at once) with documents left to try asks the
// processor to claim again at once rather than after its poll interval.
// It does not signal enqueues. On PostgreSQL and MySQL the channel never
// receives. The channel is closed when ctx ends.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// wakeUp signals Wakeups without blocking.
func (s *Store) wakeUp() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
