package http

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/httpx"
	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// Defaults of Config.
const (
	DefaultRequestTimeout  = 30 * time.Second
	DefaultMaxBatchSize    = 100
	DefaultSignatureHeader = "X-Outbox-Signature"
)

// Header names the Publisher sets on every request.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderID             = "X-Outbox-Id"     // single-message requests
	HeaderTenant         = "X-Outbox-Tenant" // when the tenant is not ""
	HeaderTopic          = "X-Outbox-Topic"  // single-message requests
	HeaderGroup          = "X-Outbox-Group"  // single-message requests with a group
)

const (
	maxRetryAfter    = 24 * time.Hour
	maxResponseBytes = 64 << 10
)

// Config configures a Publisher.
type Config struct {
	// URL receives the POSTs (http or https). Required. Only its scheme,
	// host and path appear in errors.
	URL string
	// Batch sends all the messages of one tenant in a Publish call as one
	// request whose body is a JSON array of Envelope (at most MaxBatchSize
	// per request). Defaults to false: one request per message whose body
	// is the message's Payload.
	Batch bool
	// MaxBatchSize is the most messages in one batch request. Defaults to
	// 100. Setting it without Batch is refused.
	MaxBatchSize int
	// Headers are added to every request (an Authorization header, ...).
	// Their values never appear in errors.
	Headers nethttp.Header
	// Secret returns the HMAC-SHA256 key of a tenant. When set, every
	// request carries SignatureHeader: "sha256=" and the hex HMAC of the
	// body (see Sign and Verify). An error or an empty key fails the
	// request's messages with a retryable error (code "secret"). Defaults
	// to nil: requests are not signed.
	Secret func(ctx context.Context, tenant string) ([]byte, error)
	// SignatureHeader names the signature header. Defaults to
	// "X-Outbox-Signature". Setting it without Secret is refused.
	SignatureHeader string
	// HTTPClient sends the requests. Defaults to a client with a 10s
	// connect timeout.
	HTTPClient *nethttp.Client
	// RequestTimeout bounds one request, from sending it to reading the
	// response. Defaults to 30s.
	RequestTimeout time.Duration
}

// Envelope is one message in the body of a batch request. A JSON payload
// (content type "", application/json or "+json") is embedded as Payload;
// any other payload is PayloadBase64 (standard base64 with padding in the
// JSON; omitted when empty), with Payload null. ContentType is the message's, omitted when it
// is "" (application/json).
type Envelope struct {
	ID            string            `json:"id"`
	Tenant        string            `json:"tenant,omitempty"`
	Topic         string            `json:"topic"`
	Group         string            `json:"group,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	ContentType   string            `json:"content_type,omitempty"`
	Payload       json.RawMessage   `json:"payload"`
	PayloadBase64 []byte            `json:"payload_base64,omitempty"`
}

// Publisher POSTs outbox messages as JSON to a webhook URL. It implements
// outbox.Publisher.
//
// # Requests
//
// In the default mode each message is one request: the body is its Payload
// with its content type as Content-Type (application/json when it has none),
// Idempotency-Key and HeaderID are its ID, HeaderTenant, HeaderTopic and
// HeaderGroup carry the rest, and its Headers are sent as HTTP headers
// (names the Publisher sets itself, and Host, Content-Length,
// Transfer-Encoding and Connection, are ignored; a name HTTP cannot carry
// fails the message permanently, code "header"). With Config.Batch each
// request carries up to MaxBatchSize messages of one tenant as a JSON array
// of Envelope, and its Idempotency-Key is the hex SHA-256 of the message
// IDs joined by ",". Receivers should deduplicate by the key: the outbox
// delivers at least once.
//
// # Outcomes
//
// A 2xx response sends every message of the request (a JSON response body
// of at most 64 KiB becomes the ProviderResponse). 408, 429 and 5xx are
// retryable ("http_503", ...), after the Retry-After delay when the
// response has one; any other 4xx is permanent ("http_400", ...); any other
// status is retryable. Timeouts ("timeout") and transport errors
// ("transport") are retryable. Error messages hold the status, a short
// excerpt of the response and the URL without its query; never the secret,
// the signature or the values of Config.Headers.
//
// # Ordered groups
//
// Messages are sent one request after the other. When a message of an
// ordered group fails, the group's later messages are not sent
// (outbox.ErrNotAttempted). When a batch request fails retryably only the
// first message of each group in it carries the error; the group's later
// messages are not attempted.
//
// # Cancellation
//
// When ctx ends, messages not yet sent get outbox.ErrNotAttempted joined
// with ctx.Err(); a request in flight is aborted and its messages get a
// retryable error wrapping ctx.Err().
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	url       string
	where     string // the URL without query, for errors
	batch     bool
	maxBatch  int
	headers   nethttp.Header
	secret    func(ctx context.Context, tenant string) ([]byte, error)
	sigHeader string
	client    *nethttp.Client
	timeout   time.Duration
	each      outbox.Publisher
}

// New returns a Publisher, or an error naming the first invalid Config field.
func New(cfg Config) (*Publisher, error) {
	u, err := url.Parse(cfg.URL)
	if cfg.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("http: Config.URL must be an http(s) URL")
	}
	if cfg.MaxBatchSize < 0 || cfg.RequestTimeout < 0 {
		return nil, errors.New("http: Config.MaxBatchSize and Config.RequestTimeout must not be negative")
	}
	// Options that would do nothing are refused: a reader of the
	// configuration would believe requests are signed, or batched.
	if cfg.SignatureHeader != "" && cfg.Secret == nil {
		return nil, errors.New("http: Config.SignatureHeader is set but Config.Secret is nil: requests would not be signed")
	}
	if cfg.MaxBatchSize != 0 && !cfg.Batch {
		return nil, errors.New("http: Config.MaxBatchSize is set but Config.Batch is false: every message is its own request")
	}
	sig := cmp.Or(cfg.SignatureHeader, DefaultSignatureHeader)
	if !validHeaderName(sig) {
		return nil, errors.New("http: Config.SignatureHeader is not a valid header name")
	}
	for k := range cfg.Headers {
		if !validHeaderName(k) {
			return nil, fmt.Errorf("http: Config.Headers: %q is not a valid header name", k)
		}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &nethttp.Client{Transport: &nethttp.Transport{
			Proxy:               nethttp.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	where := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	p := &Publisher{
		url:       cfg.URL,
		where:     where.String(),
		batch:     cfg.Batch,
		maxBatch:  cmp.Or(cfg.MaxBatchSize, DefaultMaxBatchSize),
		headers:   cfg.Headers.Clone(),
		secret:    cfg.Secret,
		sigHeader: textproto.CanonicalMIMEHeaderKey(sig),
		client:    cfg.HTTPClient,
		timeout:   cmp.Or(cfg.RequestTimeout, DefaultRequestTimeout),
	}
	p.each = outbox.PublishEach(p.sendOne)
	return p, nil
}

// Sign returns the signature header value of body: "sha256=" and the hex
// HMAC-SHA256 of body under secret.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify reports whether header is the signature of body under secret, in
// constant time. Receivers use it on the raw request body.
func Verify(secret, body []byte, header string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(header))
}

// Publish sends msgs and returns one Result per message, in order. See
// Publisher for the requests, outcomes, ordered groups and cancellation.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	if !p.batch {
		return p.each.Publish(ctx, msgs)
	}
	out := make([]outbox.Result, len(msgs))
	byTenant := map[string][]int{}
	var tenants []string
	for i := range msgs {
		t := msgs[i].Tenant
		if _, ok := byTenant[t]; !ok {
			tenants = append(tenants, t)
		}
		byTenant[t] = append(byTenant[t], i)
	}
	blocked := map[string]bool{}
	for _, t := range tenants {
		idx := byTenant[t]
		for len(idx) > 0 {
			var chunk []int
			for len(idx) > 0 && len(chunk) < p.maxBatch {
				i := idx[0]
				idx = idx[1:]
				if msgs[i].Group != "" && blocked[msgs[i].GroupKey()] {
					out[i].Err = fmt.Errorf("%w: an earlier message of the group failed", outbox.ErrNotAttempted)
					continue
				}
				chunk = append(chunk, i)
			}
			if len(chunk) == 0 {
				continue
			}
			if err := ctx.Err(); err != nil {
				for _, i := range chunk {
					out[i].Err = errors.Join(outbox.ErrNotAttempted, err)
				}
				continue
			}
			p.sendBatch(ctx, t, msgs, chunk, out)
			for _, i := range chunk {
				if out[i].Err != nil && msgs[i].Group != "" {
					blocked[msgs[i].GroupKey()] = true
				}
			}
		}
	}
	return out
}

// sendOne posts one message.
func (p *Publisher) sendOne(ctx context.Context, m outbox.Message) outbox.Result {
	h := nethttp.Header{}
	for k, v := range m.Headers {
		if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
			return outbox.Result{Err: outbox.Permanent("header", fmt.Sprintf("header %q cannot be sent over HTTP", redact.Printable(k, 100)))}
		}
		switch textproto.CanonicalMIMEHeaderKey(k) {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		h.Set(k, v)
	}
	h.Set(HeaderID, m.ID)
	h.Set(HeaderTopic, m.Topic)
	if m.Group != "" {
		h.Set(HeaderGroup, m.Group)
	}
	return p.post(ctx, m.Tenant, m.ID, m.EffectiveContentType(), m.Payload, h)
}

// sendBatch posts the messages at idx, all of tenant, as one request.
func (p *Publisher) sendBatch(ctx context.Context, tenant string, msgs []outbox.Message, idx []int, out []outbox.Result) {
	envs := make([]Envelope, len(idx))
	ids := make([]string, len(idx))
	for j, i := range idx {
		m := &msgs[i]
		envs[j] = Envelope{ID: m.ID, Tenant: m.Tenant, Topic: m.Topic, Group: m.Group, Headers: m.Headers, ContentType: m.ContentType}
		if m.IsJSON() {
			envs[j].Payload = m.Payload
		} else {
			envs[j].PayloadBase64 = m.Payload
		}
		ids[j] = m.ID
	}
	body, err := json.Marshal(envs)
	if err != nil {
		// Only an invalid Payload gets here: fail the messages one by one.
		for _, i := range idx {
			out[i].Err = outbox.Permanent("invalid_payload", "the payload is not a JSON document")
			if !msgs[i].IsJSON() || json.Valid(msgs[i].Payload) {
				out[i].Err = outbox.Retryable("encode", "another message of the batch has an invalid payload")
			}
		}
		return
	}
	sum := sha256.Sum256([]byte(strings.Join(ids, ",")))
	res := p.post(ctx, tenant, hex.EncodeToString(sum[:]), outbox.ContentTypeJSON, body, nethttp.Header{})
	retryable := res.Err != nil && outbox.IsRetryable(res.Err)
	first := map[string]bool{}
	for _, i := range idx {
		if retryable && msgs[i].Group != "" {
			k := msgs[i].GroupKey()
			if first[k] {
				out[i] = outbox.Result{Err: fmt.Errorf("%w: an earlier message of the group failed: %w", outbox.ErrNotAttempted, res.Err)}
				continue
			}
			first[k] = true
		}
		out[i] = res
	}
}

// post sends one request and maps the response to a Result.
func (p *Publisher) post(ctx context.Context, tenant, key, contentType string, body []byte, h nethttp.Header) outbox.Result {
	var secret []byte
	if p.secret != nil {
		s, err := p.secret(ctx, tenant)
		if err != nil || len(s) == 0 {
			if ctx.Err() != nil {
				return outbox.Result{Err: errors.Join(outbox.ErrNotAttempted, ctx.Err())}
			}
			return outbox.Result{Err: outbox.Retryable("secret", fmt.Sprintf("no signing secret for tenant %q", redact.Printable(tenant, 100)))}
		}
		secret = s
	}
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := nethttp.NewRequestWithContext(rctx, nethttp.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return outbox.Result{Err: outbox.Permanent("bad_request", "cannot build the request to "+p.where)}
	}
	for k, vs := range p.headers {
		req.Header[k] = vs
	}
	for k, vs := range h {
		if _, ok := p.headers[k]; !ok {
			req.Header[k] = vs
		}
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set(HeaderIdempotencyKey, key)
	req.Header.Del(HeaderTenant)
	if tenant != "" {
		req.Header.Set(HeaderTenant, tenant)
	}
	req.Header.Del(p.sigHeader)
	if secret != nil {
		req.Header.Set(p.sigHeader, Sign(secret, body))
	}
	resp, err := p.client.Do(req)
	if err != nil {
		code := "transport"
		switch {
		case ctx.Err() != nil:
			code = "canceled"
		case errors.Is(err, context.DeadlineExceeded) || httpx.IsTimeout(err):
			code = "timeout"
		}
		return outbox.Result{Err: &outbox.PublishError{Code: code, Message: "POST " + p.where + ": " + p.redact(transportMessage(err), secret), Err: ctx.Err()}}
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
		_ = resp.Body.Close()
	}()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	status := resp.StatusCode
	if status >= 200 && status <= 299 {
		var r outbox.Result
		if len(raw) > 0 && len(raw) <= maxResponseBytes && json.Valid(raw) {
			r.ProviderResponse = json.RawMessage(p.redact(string(raw), secret))
			if !json.Valid(r.ProviderResponse) {
				r.ProviderResponse = nil
			}
		}
		return r
	}
	code := "http_" + strconv.Itoa(status)
	msg := fmt.Sprintf("POST %s: HTTP %d", p.where, status)
	if ex := redact.Printable(p.redact(string(raw), secret), 200); ex != "" {
		msg += ": " + ex
	}
	switch {
	case status == nethttp.StatusRequestTimeout || status == nethttp.StatusTooManyRequests || status >= 500:
		return outbox.Result{Err: outbox.RetryAfter(httpx.RetryAfter(resp.Header.Get("Retry-After"), time.Now(), maxRetryAfter), code, msg)}
	case status >= 400:
		return outbox.Result{Err: outbox.Permanent(code, msg)}
	default:
		return outbox.Result{Err: outbox.Retryable(code, msg)}
	}
}

// redact removes the secret and the values of Config.Headers from s.
func (p *Publisher) redact(s string, secret []byte) string {
	s = redact.Secrets(s, string(secret))
	for _, vs := range p.headers {
		s = redact.Secrets(s, vs...)
	}
	return s
}

// transportMessage describes a transport error without the URL (its query
// may carry a token).
func transportMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return redact.Printable(err.Error(), 300)
}

// validHeaderName reports whether k is an HTTP token.
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return true
}
