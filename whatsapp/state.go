package whatsapp

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// SessionWindow is the length of a customer-service window: 24 hours from
// the user's last inbound message.
const SessionWindow = 24 * time.Hour

// Defaults of the quota.
const (
	// DefaultQuotaLimit is the number of messages a tenant may send per
	// quota window unless its limit was set.
	DefaultQuotaLimit = 1000
	// DefaultQuotaWindow is the length of a quota window.
	DefaultQuotaWindow = 24 * time.Hour
	// DefaultDedupTTL is how long an inbound message ID is remembered. Meta
	// redelivers unacknowledged webhooks for up to 7 days.
	DefaultDedupTTL = 7 * 24 * time.Hour
)

// Window is a customer-service window: free-form messages to Phone are
// allowed until ExpiresAt.
type Window struct {
	Tenant string
	// Phone is the user's number, normalised ("+" and digits).
	Phone string
	// LastInboundAt is when the user last wrote; ExpiresAt is
	// LastInboundAt + SessionWindow.
	LastInboundAt time.Time
	ExpiresAt     time.Time
}

// Open reports whether the window allows a free-form message at now.
func (w Window) Open(now time.Time) bool { return now.Before(w.ExpiresAt) }

// WindowStore keeps customer-service windows. Only inbound messages open or
// refresh a window (the business's own messages, templates included, never
// do). Implementations: MemoryState, SQLState, Fallback, and redisstate.State
// (package whatsapp/redisstate).
type WindowStore interface {
	// WindowTouch records an inbound message from phone at time at. A
	// window only moves forward: an older, late webhook does not shorten
	// it.
	WindowTouch(ctx context.Context, tenant, phone string, at time.Time) error
	// WindowGet returns the window of (tenant, phone); ok is false when the
	// user never wrote (or the window was cleaned up).
	WindowGet(ctx context.Context, tenant, phone string) (w Window, ok bool, err error)
	// WindowCleanup deletes windows that expired before now and returns how
	// many it deleted (stores that expire keys by themselves return 0).
	WindowCleanup(ctx context.Context, now time.Time) (int, error)
}

// QuotaStatus is a tenant's quota at one moment.
type QuotaStatus struct {
	// Sent is the number of messages counted in the current window.
	Sent int64
	// Limit is the tenant's limit per window.
	Limit int64
	// Remaining is Limit - Sent, at least 0.
	Remaining int64
	// ResetAt is when the current window ends (zero when nothing was sent
	// in a current window).
	ResetAt time.Time
	// Throttled is true while ThrottledUntil is after now (a rate-limit
	// answer from Meta, or an operator).
	Throttled      bool
	ThrottledUntil time.Time
}

// QuotaStore counts each tenant's messages per window (default 1000 per
// 24 h, configurable per tenant) and keeps a throttle-until. Counting is
// atomic across processes for the shared implementations (SQLState and
// redisstate.State). Implementations: MemoryState, SQLState, Fallback, and
// redisstate.State (package whatsapp/redisstate).
type QuotaStore interface {
	// QuotaConsume counts one message for tenant when the tenant is not
	// throttled and under its limit, and reports whether it did. The
	// status is the one after the call.
	QuotaConsume(ctx context.Context, tenant string, now time.Time) (QuotaStatus, bool, error)
	// QuotaGet returns tenant's status without counting anything.
	QuotaGet(ctx context.Context, tenant string, now time.Time) (QuotaStatus, error)
	// QuotaSetLimit sets tenant's limit per window; 0 restores the default.
	QuotaSetLimit(ctx context.Context, tenant string, limit int64) error
	// QuotaThrottle blocks tenant's messages until until. A throttle only
	// grows: an earlier until than the current one is ignored.
	QuotaThrottle(ctx context.Context, tenant string, until, now time.Time) error
}

// Deduper remembers inbound message IDs so the webhook hands each inbound
// message to the host once although Meta delivers it more than once.
type Deduper interface {
	// InboundClaim records (tenant, id) and reports whether it was new.
	InboundClaim(ctx context.Context, tenant, id string, now time.Time) (bool, error)
	// InboundRelease forgets (tenant, id), so a redelivery is handled again
	// (the webhook calls it when the host's callback failed).
	InboundRelease(ctx context.Context, tenant, id string) error
}

// State is a WindowStore, a QuotaStore and a Deduper in one: what
// MemoryState, SQLState and redisstate.State implement.
type State interface {
	WindowStore
	QuotaStore
	Deduper
}

// QuotaOptions configures the quota of a State.
type QuotaOptions struct {
	// DefaultLimit is the messages per window of a tenant without a limit
	// of its own. Defaults to DefaultQuotaLimit (1000).
	DefaultLimit int64
	// Window is the quota window; the count resets when it ends. Defaults to
	// DefaultQuotaWindow (24 h).
	Window time.Duration
	// DedupTTL is how long inbound message IDs are remembered. Defaults to
	// DefaultDedupTTL (7 days).
	DedupTTL time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o QuotaOptions) WithDefaults() QuotaOptions {
	o.DefaultLimit = cmp.Or(o.DefaultLimit, DefaultQuotaLimit)
	o.Window = cmp.Or(o.Window, DefaultQuotaWindow)
	o.DedupTTL = cmp.Or(o.DedupTTL, DefaultDedupTTL)
	return o
}

// NewQuotaStatus is the status of a tenant that sent sent of limit
// messages in the window ending at resetAt, throttled until
// throttledUntil, seen at now: what a QuotaStore implementation returns.
func NewQuotaStatus(sent, limit int64, resetAt, throttledUntil, now time.Time) QuotaStatus {
	s := QuotaStatus{Sent: sent, Limit: limit, Remaining: max(limit-sent, 0), ResetAt: resetAt}
	if throttledUntil.After(now) {
		s.Throttled, s.ThrottledUntil = true, throttledUntil
	}
	return s
}

func msTime(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// MemoryState is a State in process memory: for tests, examples and a
// single-replica service that accepts losing windows and counts on restart.
// The zero value is not usable; call NewMemoryState.
type MemoryState struct {
	opts    QuotaOptions
	mu      sync.Mutex
	windows map[[2]string]time.Time
	quotas  map[string]*memQuota
	seen    map[[2]string]time.Time
}

type memQuota struct {
	start, throttle time.Time
	sent, limit     int64
}

// NewMemoryState returns an empty MemoryState.
func NewMemoryState(opts QuotaOptions) *MemoryState {
	return &MemoryState{
		opts:    opts.WithDefaults(),
		windows: map[[2]string]time.Time{},
		quotas:  map[string]*memQuota{},
		seen:    map[[2]string]time.Time{},
	}
}

// WindowTouch implements WindowStore.
func (s *MemoryState) WindowTouch(_ context.Context, tenant, phone string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{tenant, phone}
	if at.After(s.windows[k]) {
		s.windows[k] = at.UTC()
	}
	return nil
}

// WindowGet implements WindowStore.
func (s *MemoryState) WindowGet(_ context.Context, tenant, phone string) (Window, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.windows[[2]string{tenant, phone}]
	if !ok {
		return Window{}, false, nil
	}
	return Window{Tenant: tenant, Phone: phone, LastInboundAt: at, ExpiresAt: at.Add(SessionWindow)}, true, nil
}

// WindowCleanup implements WindowStore.
func (s *MemoryState) WindowCleanup(_ context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, at := range s.windows {
		if !now.Before(at.Add(SessionWindow)) {
			delete(s.windows, k)
			n++
		}
	}
	for k, exp := range s.seen {
		if !now.Before(exp) {
			delete(s.seen, k)
		}
	}
	return n, nil
}

func (s *MemoryState) quota(tenant string, now time.Time) *memQuota {
	q := s.quotas[tenant]
	if q == nil {
		q = &memQuota{}
		s.quotas[tenant] = q
	}
	if !q.start.IsZero() && !now.Before(q.start.Add(s.opts.Window)) {
		q.start, q.sent = time.Time{}, 0
	}
	return q
}

func (s *MemoryState) status(q *memQuota, now time.Time) QuotaStatus {
	limit := cmp.Or(q.limit, s.opts.DefaultLimit)
	var reset time.Time
	if !q.start.IsZero() {
		reset = q.start.Add(s.opts.Window)
	}
	return NewQuotaStatus(q.sent, limit, reset, q.throttle, now)
}

// QuotaConsume implements QuotaStore.
func (s *MemoryState) QuotaConsume(_ context.Context, tenant string, now time.Time) (QuotaStatus, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.quota(tenant, now)
	st := s.status(q, now)
	if st.Throttled || st.Remaining == 0 {
		return st, false, nil
	}
	if q.start.IsZero() {
		q.start = now.UTC().Truncate(time.Millisecond)
	}
	q.sent++
	return s.status(q, now), true, nil
}

// QuotaGet implements QuotaStore.
func (s *MemoryState) QuotaGet(_ context.Context, tenant string, now time.Time) (QuotaStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status(s.quota(tenant, now), now), nil
}

// QuotaSetLimit implements QuotaStore.
func (s *MemoryState) QuotaSetLimit(_ context.Context, tenant string, limit int64) error {
	if limit < 0 {
		return errors.New("whatsapp: negative quota limit")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.quota(tenant, time.Time{}).limit = limit
	return nil
}

// QuotaThrottle implements QuotaStore.
func (s *MemoryState) QuotaThrottle(_ context.Context, tenant string, until, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.quota(tenant, now)
	if until.After(q.throttle) {
		q.throttle = until.UTC()
	}
	return nil
}

// InboundClaim implements Deduper.
func (s *MemoryState) InboundClaim(_ context.Context, tenant, id string, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{tenant, id}
	if exp, ok := s.seen[k]; ok && now.Before(exp) {
		return false, nil
	}
	s.seen[k] = now.Add(s.opts.DedupTTL)
	return true, nil
}

// InboundRelease implements Deduper.
func (s *MemoryState) InboundRelease(_ context.Context, tenant, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, [2]string{tenant, id})
	return nil
}

// Fallback is a State that uses Primary and, when a call to Primary fails
// (e.g. Redis is unreachable), logs it and makes the same call on Secondary
// (e.g. SQLState). Counts kept on the two are not merged: during an outage
// the secondary counts on its own.
type Fallback struct {
	Primary, Secondary State
	// Logger receives a warning per failed primary call. Defaults to
	// discarding.
	Logger *slog.Logger
}

func fallback[T any](ctx context.Context, f *Fallback, op string, p, s func(State) (T, error)) (T, error) {
	v, err := p(f.Primary)
	if err == nil || ctx.Err() != nil {
		return v, err
	}
	if f.Logger != nil {
		f.Logger.WarnContext(ctx, "whatsapp: primary state store failed, using the fallback", "op", op, "err", err)
	}
	return s(f.Secondary)
}

// WindowTouch implements WindowStore.
func (f *Fallback) WindowTouch(ctx context.Context, tenant, phone string, at time.Time) error {
	call := func(s State) (struct{}, error) { return struct{}{}, s.WindowTouch(ctx, tenant, phone, at) }
	_, err := fallback(ctx, f, "WindowTouch", call, call)
	return err
}

// WindowGet implements WindowStore.
func (f *Fallback) WindowGet(ctx context.Context, tenant, phone string) (Window, bool, error) {
	type r struct {
		w  Window
		ok bool
	}
	call := func(s State) (r, error) { w, ok, err := s.WindowGet(ctx, tenant, phone); return r{w, ok}, err }
	v, err := fallback(ctx, f, "WindowGet", call, call)
	return v.w, v.ok, err
}

// WindowCleanup implements WindowStore: it cleans both stores.
func (f *Fallback) WindowCleanup(ctx context.Context, now time.Time) (int, error) {
	n1, err1 := f.Primary.WindowCleanup(ctx, now)
	n2, err2 := f.Secondary.WindowCleanup(ctx, now)
	return n1 + n2, errors.Join(err1, err2)
}

// QuotaConsume implements QuotaStore.
func (f *Fallback) QuotaConsume(ctx context.Context, tenant string, now time.Time) (QuotaStatus, bool, error) {
	type r struct {
		st QuotaStatus
		ok bool
	}
	call := func(s State) (r, error) { st, ok, err := s.QuotaConsume(ctx, tenant, now); return r{st, ok}, err }
	v, err := fallback(ctx, f, "QuotaConsume", call, call)
	return v.st, v.ok, err
}

// QuotaGet implements QuotaStore.
func (f *Fallback) QuotaGet(ctx context.Context, tenant string, now time.Time) (QuotaStatus, error) {
	call := func(s State) (QuotaStatus, error) { return s.QuotaGet(ctx, tenant, now) }
	return fallback(ctx, f, "QuotaGet", call, call)
}

// QuotaSetLimit implements QuotaStore: it sets the limit on both stores.
func (f *Fallback) QuotaSetLimit(ctx context.Context, tenant string, limit int64) error {
	return errors.Join(f.Primary.QuotaSetLimit(ctx, tenant, limit), f.Secondary.QuotaSetLimit(ctx, tenant, limit))
}

// QuotaThrottle implements QuotaStore: it throttles on both stores, and
// fails only when both fail.
func (f *Fallback) QuotaThrottle(ctx context.Context, tenant string, until, now time.Time) error {
	err1 := f.Primary.QuotaThrottle(ctx, tenant, until, now)
	err2 := f.Secondary.QuotaThrottle(ctx, tenant, until, now)
	if err1 != nil && err2 != nil {
		return errors.Join(err1, err2)
	}
	return nil
}

// InboundClaim implements Deduper.
func (f *Fallback) InboundClaim(ctx context.Context, tenant, id string, now time.Time) (bool, error) {
	call := func(s State) (bool, error) { return s.InboundClaim(ctx, tenant, id, now) }
	return fallback(ctx, f, "InboundClaim", call, call)
}

// InboundRelease implements Deduper: it releases on both stores.
func (f *Fallback) InboundRelease(ctx context.Context, tenant, id string) error {
	err1 := f.Primary.InboundRelease(ctx, tenant, id)
	err2 := f.Secondary.InboundRelease(ctx, tenant, id)
	if err1 != nil && err2 != nil {
		return errors.Join(err1, err2)
	}
	return nil
}

var (
	_ State = (*MemoryState)(nil)
	_ State = (*Fallback)(nil)
)
