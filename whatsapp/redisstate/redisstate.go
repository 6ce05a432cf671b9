// Package redisstate is a whatsapp.State in Redis (go-redis v9), shared by
// every replica of a service: customer-service windows, per-tenant quotas
// and inbound dedupe. It is its own package so that only programs that
// import it compile go-redis.
//
//	state := &whatsapp.Fallback{ // Redis first; the SQL tables while Redis is down
//		Primary:   redisstate.New(redisClient, redisstate.Options{}),
//		Secondary: sqlState,
//	}
package redisstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit/whatsapp"
)

// Options configures a State.
type Options struct {
	// Prefix starts every key. Defaults to "outboxkit:whatsapp:".
	Prefix string
	whatsapp.QuotaOptions
}

// State is a whatsapp.State in Redis, shared by every replica. Quota counting is
// one Lua script per call (atomic); keys expire by themselves (TTL) when
// their window ends, so no cleanup is needed. Keys:
//
//	{prefix}quota:{tenant}     hash: start (ms), sent
//	{prefix}limit:{tenant}     the tenant's limit, when set
//	{prefix}throttle:{tenant}  throttled until (ms)
//	{prefix}window:{tenant}:{phone}  last inbound message (ms)
//	{prefix}seen:{tenant}:{id} an inbound message ID already handled
type State struct {
	c      redis.UniversalClient
	prefix string
	opts   whatsapp.QuotaOptions
}

// New returns a State over c.
func New(c redis.UniversalClient, opts Options) *State {
	if opts.Prefix == "" {
		opts.Prefix = "outboxkit:whatsapp:"
	}
	return &State{c: c, prefix: opts.Prefix, opts: opts.QuotaOptions.WithDefaults()}
}

func (s *State) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("redisstate: %s: %w", op, err)
}

// windowTouch keeps the later of the stored and the given time and sets
// the key to expire when that window ends.
var windowTouch = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local at = tonumber(ARGV[1])
if at > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  cur = at
end
local ttl = cur + tonumber(ARGV[2]) - tonumber(ARGV[3])
if ttl <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return cur
`)

// WindowTouch implements whatsapp.WindowStore.
func (s *State) WindowTouch(ctx context.Context, tenant, phone string, at time.Time) error {
	k := s.prefix + "window:" + tenant + ":" + phone
	err := windowTouch.Run(ctx, s.c, []string{k}, at.UnixMilli(), whatsapp.SessionWindow.Milliseconds(), time.Now().UnixMilli()).Err()
	return s.wrap("window touch", err)
}

// WindowGet implements whatsapp.WindowStore.
func (s *State) WindowGet(ctx context.Context, tenant, phone string) (whatsapp.Window, bool, error) {
	ms, err := s.c.Get(ctx, s.prefix+"window:"+tenant+":"+phone).Int64()
	if errors.Is(err, redis.Nil) {
		return whatsapp.Window{}, false, nil
	}
	if err != nil {
		return whatsapp.Window{}, false, s.wrap("window get", err)
	}
	at := msTime(ms)
	return whatsapp.Window{Tenant: tenant, Phone: phone, LastInboundAt: at, ExpiresAt: at.Add(whatsapp.SessionWindow)}, true, nil
}

// WindowCleanup implements whatsapp.WindowStore. Redis expires windows by itself; it
// returns 0.
func (s *State) WindowCleanup(context.Context, time.Time) (int, error) { return 0, nil }

// quotaScript counts one message (ARGV[4] == "1") or only reads the
// status. KEYS: quota hash, limit, throttle. ARGV: now ms, default limit,
// window ms, consume. It returns {allowed, sent, limit, start ms, throttle ms}.
var quotaScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[3])
local limit = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
local thr = tonumber(redis.call('GET', KEYS[3]) or '0')
local start = tonumber(redis.call('HGET', KEYS[1], 'start') or '0')
local sent = tonumber(redis.call('HGET', KEYS[1], 'sent') or '0')
if start > 0 and now >= start + window then
  redis.call('DEL', KEYS[1])
  start = 0
  sent = 0
end
if ARGV[4] ~= '1' or thr > now or sent >= limit then
  return {0, sent, limit, start, thr}
end
if start == 0 then
  start = now
  redis.call('HSET', KEYS[1], 'start', start)
end
sent = redis.call('HINCRBY', KEYS[1], 'sent', 1)
local ttl = start + window - now
if ttl < 1 then ttl = 1 end
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, sent, limit, start, thr}
`)

func (s *State) runQuota(ctx context.Context, tenant string, now time.Time, consume bool) (whatsapp.QuotaStatus, bool, error) {
	c := "0"
	if consume {
		c = "1"
	}
	keys := []string{s.prefix + "quota:" + tenant, s.prefix + "limit:" + tenant, s.prefix + "throttle:" + tenant}
	v, err := quotaScript.Run(ctx, s.c, keys, now.UnixMilli(), s.opts.DefaultLimit, s.opts.Window.Milliseconds(), c).Int64Slice()
	if err != nil {
		return whatsapp.QuotaStatus{}, false, s.wrap("quota", err)
	}
	if len(v) != 5 {
		return whatsapp.QuotaStatus{}, false, fmt.Errorf("redisstate: quota: unexpected reply of %d values", len(v))
	}
	var reset time.Time
	if v[3] > 0 {
		reset = msTime(v[3]).Add(s.opts.Window)
	}
	return whatsapp.NewQuotaStatus(v[1], v[2], reset, msTime(v[4]), now), v[0] == 1, nil
}

// QuotaConsume implements whatsapp.QuotaStore.
func (s *State) QuotaConsume(ctx context.Context, tenant string, now time.Time) (whatsapp.QuotaStatus, bool, error) {
	return s.runQuota(ctx, tenant, now, true)
}

// QuotaGet implements whatsapp.QuotaStore.
func (s *State) QuotaGet(ctx context.Context, tenant string, now time.Time) (whatsapp.QuotaStatus, error) {
	st, _, err := s.runQuota(ctx, tenant, now, false)
	return st, err
}

// QuotaSetLimit implements whatsapp.QuotaStore.
func (s *State) QuotaSetLimit(ctx context.Context, tenant string, limit int64) error {
	k := s.prefix + "limit:" + tenant
	switch {
	case limit < 0:
		return errors.New("redisstate: negative quota limit")
	case limit == 0:
		return s.wrap("set limit", s.c.Del(ctx, k).Err())
	default:
		return s.wrap("set limit", s.c.Set(ctx, k, limit, 0).Err())
	}
}

var throttleScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local untilms = tonumber(ARGV[1])
if untilms > cur then
  local ttl = untilms - tonumber(ARGV[2])
  if ttl > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
  end
end
return 1
`)

// QuotaThrottle implements whatsapp.QuotaStore.
func (s *State) QuotaThrottle(ctx context.Context, tenant string, until, now time.Time) error {
	err := throttleScript.Run(ctx, s.c, []string{s.prefix + "throttle:" + tenant}, until.UnixMilli(), now.UnixMilli()).Err()
	return s.wrap("throttle", err)
}

// InboundClaim implements whatsapp.Deduper with SET NX and the dedup TTL.
func (s *State) InboundClaim(ctx context.Context, tenant, id string, _ time.Time) (bool, error) {
	ok, err := s.c.SetNX(ctx, s.prefix+"seen:"+tenant+":"+id, 1, s.opts.DedupTTL).Result()
	return ok, s.wrap("inbound claim", err)
}

// InboundRelease implements whatsapp.Deduper.
func (s *State) InboundRelease(ctx context.Context, tenant, id string) error {
	return s.wrap("inbound release", s.c.Del(ctx, s.prefix+"seen:"+tenant+":"+id).Err())
}

var _ whatsapp.State = (*State)(nil)

func msTime(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
