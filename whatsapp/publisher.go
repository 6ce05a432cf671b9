package whatsapp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/internal/httpx"
	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// Defaults of Config.
const (
	// DefaultBaseURL is the Graph API root.
	DefaultBaseURL = "https://graph.facebook.com"
	// DefaultAPIVersion is a currently supported Graph API version
	// (released 2026-02, supported until 2028-07).
	DefaultAPIVersion = "v25.0"
	// DefaultTimeout bounds one Cloud API request.
	DefaultTimeout = 30 * time.Second
	// DefaultThroughput is Meta's default throughput per business phone
	// number, in messages per second.
	DefaultThroughput = 80
)

// Error codes of this package (Meta's own codes are their numbers as
// strings, e.g. "131047").
const (
	// CodeWindowClosed: a free-form message to a user outside the 24-hour
	// customer-service window; send a template. Permanent, decided before
	// any HTTP call.
	CodeWindowClosed = "session_window_closed"
	// CodeQuotaExceeded: the tenant's quota is used up; the message is
	// deferred (outbox.Defer, no attempt counted) until the window resets.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeThrottled: the tenant or the recipient is throttled after a rate
	// limit, or the business number's throughput limit is reached; the
	// message is deferred (outbox.Defer, no attempt counted) until the
	// throttle ends.
	CodeThrottled = "throttled"
	// CodeInvalidPayload: the message payload cannot be sent. Permanent.
	CodeInvalidPayload = "invalid_payload"
	// CodeInvalidPhone: "to" is not a phone number. Permanent.
	CodeInvalidPhone = "invalid_phone_number"
	// CodeUnknownTenant: no credentials for the message's tenant. Permanent.
	CodeUnknownTenant = "unknown_tenant"
	// CodeCredentials: the credentials provider failed. Retryable.
	CodeCredentials = "credentials_unavailable"
	// CodeStateUnavailable: the window or quota store failed (e.g. Redis
	// is down); the message is deferred (outbox.Defer, no attempt counted)
	// for Config.StateRetry, so an outage never dead-letters messages.
	// Wire a Fallback (Redis, then SQLState) to keep sending through one.
	CodeStateUnavailable = "state_unavailable"
	// CodeCredentialsRejected: Meta rejected the tenant's access token
	// (190: expired, 0: invalid or revoked). The tenant's sends pause: its
	// messages are deferred (outbox.Defer, no attempt counted) until the
	// CredentialsProvider returns different credentials for it.
	CodeCredentialsRejected = "credentials_rejected"
	// CodeTimeout: the Cloud API did not answer in time. Retryable.
	CodeTimeout = "timeout"
	// CodeNetwork: the request failed before an answer. Retryable.
	CodeNetwork = "network_error"
	// CodeBadResponse: a 2xx answer without a message ID. Retryable (the
	// message may have been sent: at-least-once).
	CodeBadResponse = "bad_response"
)

// Config configures a Publisher.
type Config struct {
	// Credentials gives each tenant's phone number ID and access token.
	// Required.
	Credentials CredentialsProvider
	// BaseURL is the Graph API root. Defaults to DefaultBaseURL.
	BaseURL string
	// APIVersion is the Graph API version in the URL ("v25.0"). Defaults
	// to DefaultAPIVersion.
	APIVersion string
	// HTTPClient sends the requests. Defaults to a client with Timeout.
	HTTPClient *http.Client
	// Timeout bounds each request (on top of ctx). Defaults to
	// DefaultTimeout (30 s).
	Timeout time.Duration
	// Errors classifies Meta's error codes. Defaults to DefaultErrorMap().
	Errors *ErrorMap
	// ErrorClasses overrides the class of some codes for this deployment
	// (parse them with ParseErrorClasses, e.g. "131026=retryable"): the
	// publisher classifies with a copy of Errors that gives each of these
	// codes its class. The default map follows Meta's current error-code
	// reference, which differs from older tables on some codes; a
	// deployment that sees otherwise sets them here. Defaults to none.
	ErrorClasses map[int]ErrorClass
	// Windows, when set, is checked before every free-form (non-template)
	// message: outside the window the message fails with CodeWindowClosed
	// and no HTTP call is made. Defaults to no check (Meta then answers
	// 131047, also permanent).
	Windows WindowStore
	// Quotas, when set, counts every message against its tenant's quota and
	// throttle; a used-up quota or a throttle defers the message
	// (outbox.Defer with CodeQuotaExceeded or CodeThrottled: tried again
	// when the window resets or the throttle ends, without an attempt
	// counted), never fails it. A message is counted when it is about to
	// be sent (after the payload and window checks), whether or not Meta
	// then accepts it. Rate-limit errors from Meta throttle the tenant
	// here. Defaults to no quota.
	Quotas QuotaStore
	// Throughput is the most messages per second sent from one business
	// phone number by this Publisher, counted where Meta counts them: no
	// one-second window holds more than Throughput requests arriving at
	// the Cloud API, whatever the delays between the publisher and Meta.
	// Each send holds one of Throughput places from its start until a
	// second after its answer, so the rate reached is Throughput per
	// (1 s + the answer's round trip), e.g. about 66/s for 80 with 200 ms
	// answers: the margin Meta's per-second limit needs. Sends are also
	// paced 1/Throughput apart. The limiter is process-local, so with
	// several replicas give each its share. A message waits up to a second
	// for its slot; one that would wait longer is deferred (outbox.Defer,
	// CodeThrottled, no attempt counted) rather than hold its lease.
	// Defaults to DefaultThroughput; negative disables it.
	Throughput float64
	// DefaultLanguage is the template language of seed-shaped payloads that
	// name none. Defaults to "en_US".
	DefaultLanguage string
	// Logger receives structured logs (never tokens or payloads). Defaults
	// to discarding them.
	Logger *slog.Logger
	// Clock tells the time for windows, quotas and throttles. Defaults to
	// outbox.SystemClock.
	Clock outbox.Clock
	// StateRetry is how long a message is deferred when the window or
	// quota store fails (CodeStateUnavailable). Defaults to 30s.
	StateRetry time.Duration
	// CredentialsRetry is how long a message of a paused tenant (its
	// access token was rejected) is deferred before the publisher asks the
	// CredentialsProvider again. Defaults to 1m.
	CredentialsRetry time.Duration
	// Observer receives the tenant-wide events: a tenant paused because
	// Meta rejected its credentials, and resumed when they changed.
	// Defaults to none.
	Observer Observer
}

// Observer receives a Publisher's tenant-wide events. Implementations must
// be fast and must not block.
type Observer interface {
	// OnTenantPaused: Meta rejected the tenant's credentials; its messages
	// are deferred until they change.
	OnTenantPaused(ctx context.Context, e TenantEvent)
	// OnTenantResumed: the tenant's credentials changed after a pause; its
	// messages are sent again.
	OnTenantResumed(ctx context.Context, e TenantEvent)
}

// TenantEvent describes a pause or resume of one tenant's sends.
type TenantEvent struct {
	Tenant string
	// Code is Meta's error code that paused the tenant ("190").
	Code string
	// Reason is the error's description (no secrets).
	Reason string
	// Since is when the pause began.
	Since time.Time
}

// Publisher sends outbox messages through the WhatsApp Cloud API. It
// implements outbox.Publisher and is safe for concurrent use.
type Publisher struct {
	cfg      Config
	endpoint *url.URL
	limiter  *limiter

	mu         sync.Mutex
	recipients map[[2]string]*recipientThrottle
	paused     map[string]tenantPause
	each       outbox.Publisher // Publish: Send per message (outbox.PublishEach)
}

// tenantPause records that Meta rejected a tenant's credentials: the
// fingerprint of the rejected credentials (never the token itself).
type tenantPause struct {
	creds  [sha256.Size]byte
	code   string
	reason string
	since  time.Time
}

func fingerprint(c Credentials) [sha256.Size]byte {
	return sha256.Sum256([]byte(c.PhoneNumberID + "\x00" + c.AccessToken))
}

type recipientThrottle struct {
	until    time.Time
	failures int
}

// NewPublisher returns a Publisher for cfg.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.Credentials == nil {
		return nil, outbox.InvalidParam("Config.Credentials", "is required")
	}
	cfg.BaseURL = strings.TrimRight(cmp.Or(cfg.BaseURL, DefaultBaseURL), "/")
	cfg.APIVersion = cmp.Or(cfg.APIVersion, DefaultAPIVersion)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.DefaultLanguage = cmp.Or(cfg.DefaultLanguage, "en_US")
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Errors == nil {
		cfg.Errors = DefaultErrorMap()
	}
	if len(cfg.ErrorClasses) > 0 {
		m, err := cfg.Errors.WithClasses(cfg.ErrorClasses)
		if err != nil {
			return nil, err
		}
		cfg.Errors = m
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = outbox.SystemClock
	}
	if cfg.Throughput == 0 {
		cfg.Throughput = DefaultThroughput
	}
	if cfg.Timeout < 0 {
		return nil, outbox.InvalidParam("Config.Timeout", "must not be negative")
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, outbox.InvalidParam("Config.BaseURL", "must be an http(s) URL")
	}
	if strings.ContainsAny(cfg.APIVersion, "/?#") {
		return nil, outbox.InvalidParam("Config.APIVersion", "must be a version such as v25.0")
	}
	if cfg.StateRetry < 0 || cfg.CredentialsRetry < 0 {
		return nil, outbox.InvalidParam("Config.StateRetry", "and CredentialsRetry must not be negative")
	}
	cfg.StateRetry = cmp.Or(cfg.StateRetry, 30*time.Second)
	cfg.CredentialsRetry = cmp.Or(cfg.CredentialsRetry, time.Minute)
	p := &Publisher{cfg: cfg, endpoint: u, recipients: map[[2]string]*recipientThrottle{}, paused: map[string]tenantPause{}}
	p.each = outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result { return p.Send(ctx, &m) })
	if cfg.Throughput > 0 {
		p.limiter = newLimiter(cfg.Throughput)
	}
	return p, nil
}

// Publish sends msgs one by one, in order, and returns one Result per
// message. In an ordered group (Message.Group != "") it stops at the first
// failure: the group's later messages get outbox.ErrNotAttempted so FIFO
// holds. When ctx ends, the messages not sent yet get an error matching both
// outbox.ErrNotAttempted and ctx.Err(). It is outbox.PublishEach over Send.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	return p.each.Publish(ctx, msgs)
}

// Send sends one message and returns its result: the wamid as
// ProviderMessageID and the API's answer as ProviderResponse, or an error:
// an *outbox.PublishError (permanent, or retryable with an attempt counted)
// or, for quotas, throttles and rate limits, an *outbox.DeferError (tried
// again after its delay without an attempt counted).
func (p *Publisher) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	if err := outbox.RequireJSON(m); err != nil {
		return outbox.Result{Err: err}
	}
	req, err := BuildRequest(m.Payload, p.cfg.DefaultLanguage, m.ID)
	if err != nil {
		code := CodeInvalidPayload
		if errors.Is(err, ErrInvalidPhone) {
			code = CodeInvalidPhone
		}
		return outbox.Result{Err: &outbox.PublishError{Code: code, Message: err.Error(), Permanent: true, Err: err}}
	}
	creds, err := p.cfg.Credentials.Credentials(ctx, m.Tenant)
	if err != nil {
		if errors.Is(err, ErrUnknownTenant) {
			return outbox.Result{Err: &outbox.PublishError{Code: CodeUnknownTenant, Message: "no WhatsApp credentials for the message's tenant", Permanent: true, Err: err}}
		}
		return outbox.Result{Err: &outbox.PublishError{Code: CodeCredentials, Message: "the credentials provider failed", Err: err}}
	}
	if creds.PhoneNumberID == "" || creds.AccessToken == "" || strings.ContainsAny(creds.PhoneNumberID, "/?#") {
		return outbox.Result{Err: &outbox.PublishError{Code: CodeUnknownTenant, Message: "the tenant's WhatsApp credentials lack a phone number ID or an access token", Permanent: true}}
	}
	now := p.cfg.Clock.Now()
	if err := p.checkPause(ctx, m.Tenant, creds); err != nil {
		return outbox.Result{Err: err}
	}

	if !req.Template && p.cfg.Windows != nil {
		w, ok, err := p.cfg.Windows.WindowGet(ctx, m.Tenant, req.To)
		if err != nil {
			return outbox.Result{Err: p.stateUnavailable(ctx, m, "the session window store failed", err)}
		}
		if !ok || !w.Open(now) {
			return outbox.Result{Err: outbox.Permanent(CodeWindowClosed, "free-form message outside the 24-hour customer-service window: the user has not written in the last 24 hours; send a template instead")}
		}
	}
	// Throttles and quotas defer the message (outbox.Defer): it is tried
	// again after the wait without an attempt counted, so however long a
	// tenant is throttled or out of quota, it is never dead-lettered for it.
	if d := p.recipientWait(m.Tenant, req.To, now); d > 0 {
		return outbox.Result{Err: outbox.Defer(positive(d), CodeThrottled, "the recipient is throttled after Meta's pair rate limit (131056)")}
	}
	// Take a throughput token first, so that a message deferred for
	// throughput is not counted against the quota.
	var (
		wait time.Duration
		sl   *slot
	)
	if p.limiter != nil {
		sl, wait = p.limiter.reserve(creds.PhoneNumberID, time.Now())
		if wait > maxThroughputWait {
			sl.cancel()
			return outbox.Result{Err: outbox.Defer(positive(wait), CodeThrottled, fmt.Sprintf("the business phone number's throughput limit of %g messages per second is reached", p.cfg.Throughput))}
		}
	}
	if p.cfg.Quotas != nil {
		st, ok, err := p.cfg.Quotas.QuotaConsume(ctx, m.Tenant, now)
		if err != nil {
			sl.cancel()
			return outbox.Result{Err: p.stateUnavailable(ctx, m, "the quota store failed", err)}
		}
		if !ok {
			sl.cancel()
			if st.Throttled {
				return outbox.Result{Err: outbox.Defer(positive(st.ThrottledUntil.Sub(now)), CodeThrottled, "the tenant is throttled after a rate limit until "+st.ThrottledUntil.Format(time.RFC3339))}
			}
			return outbox.Result{Err: outbox.Defer(positive(st.ResetAt.Sub(now)), CodeQuotaExceeded, fmt.Sprintf("the tenant's quota of %d messages is used up until %s", st.Limit, st.ResetAt.Format(time.RFC3339)))}
		}
	}
	if wait > 0 {
		if err := sleep(ctx, wait); err != nil {
			return outbox.Result{Err: fmt.Errorf("%w: %w", outbox.ErrNotAttempted, err)}
		}
	}
	if sl != nil {
		done, err := sl.admit(ctx)
		if err != nil {
			return outbox.Result{Err: fmt.Errorf("%w: %w", outbox.ErrNotAttempted, err)}
		}
		defer done()
	}
	return p.post(ctx, m, req, creds)
}

// stateUnavailable defers m after a window or quota store failure: the
// store's outage is not the message's fault, so no attempt is counted.
func (p *Publisher) stateUnavailable(ctx context.Context, m *outbox.Message, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", outbox.ErrNotAttempted, ctx.Err())
	}
	p.cfg.Logger.WarnContext(ctx, "whatsapp: "+what+"; message deferred", "message_id", m.ID, "tenant", m.Tenant, "retry_in", p.cfg.StateRetry, "err", err)
	return outbox.Defer(p.cfg.StateRetry, CodeStateUnavailable, what+": "+err.Error())
}

// checkPause defers the message of a paused tenant while its credentials
// are the rejected ones, and lifts the pause once they changed.
func (p *Publisher) checkPause(ctx context.Context, tenant string, creds Credentials) error {
	p.mu.Lock()
	tp, ok := p.paused[tenant]
	same := ok && tp.creds == fingerprint(creds)
	if ok && !same {
		delete(p.paused, tenant)
	}
	p.mu.Unlock()
	switch {
	case same:
		return outbox.Defer(p.cfg.CredentialsRetry, CodeCredentialsRejected,
			fmt.Sprintf("the tenant's sends are paused since %s: Meta rejected its credentials (%s, %s); update them", tp.since.Format(time.RFC3339), tp.code, tp.reason))
	case ok:
		p.cfg.Logger.InfoContext(ctx, "whatsapp: the tenant's credentials changed; its sends resume", "tenant", tenant, "paused_since", tp.since)
		if p.cfg.Observer != nil {
			p.cfg.Observer.OnTenantResumed(ctx, TenantEvent{Tenant: tenant, Code: tp.code, Reason: tp.reason, Since: tp.since})
		}
	}
	return nil
}

// pause stops the tenant's sends until its credentials change.
func (p *Publisher) pause(ctx context.Context, tenant string, creds Credentials, code, reason string, now time.Time) {
	fp := fingerprint(creds)
	p.mu.Lock()
	tp, was := p.paused[tenant]
	fresh := !was || tp.creds != fp
	if fresh {
		tp = tenantPause{creds: fp, code: code, reason: reason, since: now}
		p.paused[tenant] = tp
	}
	p.mu.Unlock()
	if !fresh {
		return
	}
	p.cfg.Logger.ErrorContext(ctx, "whatsapp: Meta rejected the tenant's credentials; its sends are paused (messages deferred, not failed) until the CredentialsProvider returns new ones",
		"tenant", tenant, "code", code, "reason", reason)
	if p.cfg.Observer != nil {
		p.cfg.Observer.OnTenantPaused(ctx, TenantEvent{Tenant: tenant, Code: code, Reason: reason, Since: now})
	}
}

// maxThroughputWait is the longest a message waits in Send for a
// throughput token; a longer wait defers it instead, so it does not hold
// its lease (and the rest of its batch) while it waits.
const maxThroughputWait = time.Second

// positive makes a deferral at least a second, so a deferred message is
// never due again at once.
func positive(d time.Duration) time.Duration { return max(d, time.Second) }

func (p *Publisher) post(ctx context.Context, m *outbox.Message, req Request, creds Credentials) outbox.Result {
	u := *p.endpoint
	u.Path = strings.TrimRight(u.Path, "/") + "/" + p.cfg.APIVersion + "/" + creds.PhoneNumberID + "/messages"
	rctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(rctx, http.MethodPost, u.String(), bytes.NewReader(req.Body))
	if err != nil {
		return outbox.Result{Err: &outbox.PublishError{Code: CodeNetwork, Message: "building the request failed"}}
	}
	hreq.Header.Set("Authorization", "Bearer "+creds.AccessToken)
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	resp, err := p.cfg.HTTPClient.Do(hreq)
	if err != nil {
		return outbox.Result{Err: p.transportError(ctx, rctx, err, creds)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return outbox.Result{Err: p.transportError(ctx, rctx, err, creds)}
	}
	body = redact.SecretsBytes(body, secrets(creds)...)
	var pr json.RawMessage
	if json.Valid(body) {
		pr = body
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		var ok struct {
			Messages []struct {
				ID string `json:"id"`
			} `json:"messages"`
		}
		if json.Unmarshal(body, &ok) != nil || len(ok.Messages) == 0 || ok.Messages[0].ID == "" {
			return outbox.Result{ProviderResponse: pr, Err: outbox.Retryable(CodeBadResponse, fmt.Sprintf("HTTP %d without a message id in the answer", resp.StatusCode))}
		}
		p.recipientOK(m.Tenant, req.To)
		return outbox.Result{ProviderMessageID: ok.Messages[0].ID, ProviderResponse: pr}
	}
	return outbox.Result{ProviderResponse: pr, Err: p.apiError(ctx, m, req, creds, resp, body)}
}

// APIError is the error object of a Cloud API answer or webhook.
type APIError struct {
	Message   string `json:"message"`
	Type      string `json:"type,omitempty"`
	Code      int    `json:"code"`
	Title     string `json:"title,omitempty"`
	ErrorData struct {
		Details string `json:"details,omitempty"`
	} `json:"error_data"`
	Href      string `json:"href,omitempty"`
	FBTraceID string `json:"fbtrace_id,omitempty"`
}

func (p *Publisher) apiError(ctx context.Context, m *outbox.Message, req Request, creds Credentials, resp *http.Response, body []byte) error {
	now := p.cfg.Clock.Now()
	retryAfter := httpx.RetryAfter(resp.Header.Get("Retry-After"), now, 7*24*time.Hour)
	var env struct {
		Error *struct {
			APIError
			Code *int `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &env) != nil || env.Error == nil || env.Error.Code == nil {
		// No usable code: classify by HTTP status.
		code := "http_" + strconv.Itoa(resp.StatusCode)
		msg := fmt.Sprintf("HTTP %d from the Cloud API without an error code", resp.StatusCode)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			d := cmp.Or(retryAfter, time.Minute)
			p.throttleTenant(ctx, m.Tenant, now.Add(d), now)
			p.cfg.Logger.InfoContext(ctx, "whatsapp: HTTP 429; tenant throttled, message deferred", "message_id", m.ID, "tenant", m.Tenant, "retry_after", d)
			return outbox.Defer(positive(d), code, msg)
		case resp.StatusCode >= 500:
			return &outbox.PublishError{Code: code, Message: msg, RetryAfter: retryAfter}
		default:
			return &outbox.PublishError{Code: code, Message: msg, Permanent: true}
		}
	}
	e := env.Error.APIError
	e.Code = *env.Error.Code
	spec := p.cfg.Errors.Classify(e.Code, e.ErrorData.Details)
	msg := spec.Description
	if meta := strings.TrimSpace(cmp.Or(e.Message, e.Title)); meta != "" {
		msg += "; Meta: " + meta
	}
	if e.ErrorData.Details != "" {
		msg += " (" + e.ErrorData.Details + ")"
	}
	if e.FBTraceID != "" {
		msg += " [fbtrace_id " + e.FBTraceID + "]"
	}
	msg = redact.Secrets(msg, secrets(creds)...)
	code := strconv.Itoa(e.Code)
	d := retryAfter
	switch spec.RateLimit {
	case ScopeTenant:
		d = cmp.Or(d, spec.RetryAfter, time.Minute)
		p.throttleTenant(ctx, m.Tenant, now.Add(d), now)
		p.cfg.Logger.InfoContext(ctx, "whatsapp: rate limited; tenant throttled, message deferred", "message_id", m.ID, "tenant", m.Tenant, "code", e.Code, "retry_after", d)
		return outbox.Defer(positive(d), code, msg)
	case ScopeCredentials:
		p.pause(ctx, m.Tenant, creds, code, spec.Description, now)
		return outbox.Defer(p.cfg.CredentialsRetry, CodeCredentialsRejected, "the tenant's sends are paused until its credentials change: "+msg)
	case ScopeRecipient:
		d = cmp.Or(d, p.recipientFailed(m.Tenant, req.To, now))
		p.cfg.Logger.InfoContext(ctx, "whatsapp: pair rate limited; recipient throttled, message deferred", "message_id", m.ID, "tenant", m.Tenant, "code", e.Code, "retry_after", d)
		return outbox.Defer(positive(d), code, msg)
	}
	pe := &outbox.PublishError{Code: code, Message: msg, Permanent: !spec.Retryable}
	if pe.Permanent {
		return pe
	}
	pe.RetryAfter = cmp.Or(d, spec.RetryAfter)
	p.cfg.Logger.WarnContext(ctx, "whatsapp: send failed", "message_id", m.ID, "tenant", m.Tenant, "code", e.Code, "retry_after", pe.RetryAfter)
	return pe
}

func (p *Publisher) throttleTenant(ctx context.Context, tenant string, until, now time.Time) {
	if p.cfg.Quotas == nil {
		return
	}
	if err := p.cfg.Quotas.QuotaThrottle(ctx, tenant, until, now); err != nil {
		p.cfg.Logger.ErrorContext(ctx, "whatsapp: recording a throttle failed", "tenant", tenant, "err", err)
	}
}

// recipientFailed records a pair-rate-limit failure and returns Meta's
// advised wait: 4^X seconds, X the consecutive failures so far (1, 4, 16,
// 64 ... capped at about 68 minutes).
func (p *Publisher) recipientFailed(tenant, phone string, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := [2]string{tenant, phone}
	r := p.recipients[k]
	if r == nil {
		r = &recipientThrottle{}
		p.recipients[k] = r
	}
	d := time.Duration(math.Pow(4, float64(min(r.failures, 6)))) * time.Second
	r.failures++
	r.until = now.Add(d)
	// forget recipients whose throttle ended long ago, so the map stays small
	if len(p.recipients) > 10000 {
		for k, v := range p.recipients {
			if now.Sub(v.until) > time.Hour {
				delete(p.recipients, k)
			}
		}
	}
	return d
}

func (p *Publisher) recipientWait(tenant, phone string, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.recipients[[2]string{tenant, phone}]; r != nil && r.until.After(now) {
		return r.until.Sub(now)
	}
	return 0
}

func (p *Publisher) recipientOK(tenant, phone string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.recipients, [2]string{tenant, phone})
}

func (p *Publisher) transportError(ctx, rctx context.Context, err error, creds Credentials) error {
	switch {
	case ctx.Err() != nil:
		return &outbox.PublishError{Code: "canceled", Message: "the send was cancelled before the Cloud API answered", Err: ctx.Err()}
	case errors.Is(err, context.DeadlineExceeded) || rctx.Err() != nil || httpx.IsTimeout(err):
		return &outbox.PublishError{Code: CodeTimeout, Message: fmt.Sprintf("the Cloud API did not answer within %s", p.cfg.Timeout)}
	}
	// The error text names the URL (no secret in it) and the network
	// failure; redact anyway in case a custom transport adds more.
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	return &outbox.PublishError{Code: CodeNetwork, Message: "request to the Cloud API failed: " + redact.Secrets(msg, secrets(creds)...)}
}

// secrets are the credentials that must never reach an error, a log or a
// stored message (a server may echo them back).
func secrets(c Credentials) []string { return []string{c.AccessToken, c.AppSecret, c.VerifyToken} }

// limiter keeps each key's (business phone number's) sends to at most n
// in any one-second window, where it counts: at the server. A send reaches
// Meta some time after the publisher let it go (goroutine scheduling, the
// connection, the network, a stall on either side), and that time varies,
// so spacing the starts 1/n apart (what a token bucket does) lets n+1
// arrive within a second whenever an early send is slowed more than a
// later one.
//
// So each send holds one of n places from the moment it starts until a
// second after its answer came back (an answer comes after the request
// arrived). A send starts only when fewer than n sends are in flight or
// were answered within the last second. Then, for any one-second window at
// the server, the last of the sends arriving in it started when every
// other one was either in flight or answered less than a second before
// (each of them arrived, and so was answered, no earlier than the window's
// start): at most n-1 others, whatever the delays. The price is that a
// place is held for the answer's round trip on top of the second: with
// answers taking 200 ms, 80 places give about 66 sends a second.
//
// Before that, reserve hands out slots spaced by 1/n, so that a caller
// learns at once roughly how long it would wait (and defers the message
// instead of holding its lease when that is too long), and the sends of a
// burst are spread over the second rather than sent at once.
type limiter struct {
	n       int
	spacing time.Duration
	mu      sync.Mutex
	keys    map[string]*pace
}

// pace is one key's state.
type pace struct {
	next     time.Time     // the next free slot
	inFlight int           // sends started and not answered yet
	answered []time.Time   // when sends were answered, oldest first; kept for a second
	changed  chan struct{} // closed (and replaced) when a send is answered
}

// slot is a reserved send slot.
type slot struct {
	l  *limiter
	p  *pace
	at time.Time
}

func newLimiter(perSecond float64) *limiter {
	n := max(1, int(math.Floor(perSecond)))
	spacing := time.Duration(math.Ceil(float64(time.Second) / perSecond)) // rounded up: n spacings span a second
	return &limiter{n: n, spacing: spacing, keys: map[string]*pace{}}
}

func (l *limiter) pace(key string) *pace {
	p := l.keys[key]
	if p == nil {
		p = &pace{changed: make(chan struct{})}
		l.keys[key] = p
	}
	return p
}

// reserve takes key's next send slot at or after now and returns it with
// how long to wait for it.
func (l *limiter) reserve(key string, now time.Time) (*slot, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pace(key)
	at := now
	if p.next.After(at) {
		at = p.next
	}
	p.next = at.Add(l.spacing)
	return &slot{l: l, p: p, at: at}, at.Sub(now)
}

// cancel gives the slot back when no later slot was handed out since.
func (s *slot) cancel() {
	if s == nil {
		return
	}
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if s.p.next.Equal(s.at.Add(s.l.spacing)) {
		s.p.next = s.at
	}
}

// admitAt starts a send of p at now and returns 0 when fewer than n sends
// are in flight or were answered within the second before now; otherwise
// it starts nothing and returns how long until an answered send frees its
// place (-1: only an answer can free one). The caller holds l.mu.
func (l *limiter) admitAt(p *pace, now time.Time) time.Duration {
	i := 0
	for i < len(p.answered) && now.Sub(p.answered[i]) >= time.Second {
		i++
	}
	p.answered = p.answered[i:]
	if p.inFlight+len(p.answered) < l.n {
		p.inFlight++
		return 0
	}
	if len(p.answered) == 0 {
		return -1
	}
	return p.answered[0].Add(time.Second).Sub(now)
}

// answeredAt records that a send of p started by admitAt was answered (or
// failed) at now. The caller holds l.mu.
func (l *limiter) answeredAt(p *pace, now time.Time) {
	p.inFlight--
	p.answered = append(p.answered, now)
	close(p.changed)
	p.changed = make(chan struct{})
}

// admit waits until the slot's send may start (see limiter) and starts
// it; call the returned done once the send was answered or failed. Times
// are read under the lock, so they are recorded in the order they happened.
func (s *slot) admit(ctx context.Context) (done func(), err error) {
	l, p := s.l, s.p
	for {
		l.mu.Lock()
		d := l.admitAt(p, time.Now())
		changed := p.changed
		l.mu.Unlock()
		if d == 0 {
			var once sync.Once
			return func() {
				once.Do(func() {
					l.mu.Lock()
					l.answeredAt(p, time.Now())
					l.mu.Unlock()
				})
			}, nil
		}
		var (
			t     *time.Timer
			timer <-chan time.Time
		)
		if d > 0 {
			t = time.NewTimer(d)
			timer = t.C
		}
		select {
		case <-timer:
		case <-changed:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
