package flowcatalyst

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit/internal/httpx"
	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// Default timeouts, as in seed 004's API client.
const (
	DefaultConnectTimeout = 10 * time.Second
	DefaultRequestTimeout = 30 * time.Second
)

// Limits on what the Publisher reads from a response.
const (
	maxResponseBytes = 8 << 20
	maxErrorBytes    = 64 << 10
	maxRetryAfter    = 24 * time.Hour
)

// Config configures a Publisher.
type Config struct {
	// BaseURL is the FlowCatalyst platform, e.g.
	// "https://flowcatalyst.example.com"; the API paths are appended to it
	// (a path prefix in BaseURL is kept). Required.
	BaseURL string
	// API is the API generation: CurrentAPI, SeedAPI or your own. Defaults
	// to CurrentAPI.
	API API
	// BatchSize is the most items sent in one request; a Publish call with
	// more messages is split. Defaults to API.MaxBatchSize and must not
	// exceed it.
	BatchSize int
	// Token supplies the bearer token: StaticToken, *ClientCredentials or
	// your own. Defaults to none (no Authorization header).
	Token TokenSource
	// HTTPClient sends the requests. Defaults to a client whose connect
	// timeout is ConnectTimeout. Its own Timeout, if any, also applies.
	HTTPClient *http.Client
	// ConnectTimeout bounds establishing a connection (TCP and TLS) when
	// HTTPClient is nil. Defaults to 10s.
	ConnectTimeout time.Duration
	// RequestTimeout bounds one request, from sending to reading the whole
	// response. Defaults to 30s.
	RequestTimeout time.Duration
	// UserAgent defaults to "outboxkit-flowcatalyst".
	UserAgent string
	// Logger receives one debug line per request, a warning per failed
	// request (HTTP error or transport failure) and warnings for responses
	// that break the contract. Defaults to discarding them.
	Logger *slog.Logger
	// ChargeEveryItem makes a whole-request failure (HTTP error, timeout)
	// count as a failed attempt of every item of the request, as seed 004
	// does. By default only the first item of each ordered group is
	// charged; the group's later items are not attempted (they wait behind
	// the first anyway) and keep their attempts.
	ChargeEveryItem bool
}

// Publisher publishes outbox messages to the FlowCatalyst batch API. It
// implements outbox.Publisher: topic TopicEvent goes to API.EventsPath,
// TopicDispatchJob to API.DispatchJobsPath (and TopicAuditLog to
// API.AuditLogsPath when set). Each message's Payload is one item, sent as
// the JSON document it is.
//
// # Outcomes
//
// HTTP 400 and 403 fail every message of the request permanently (codes
// "http_400", "http_403"); 401 (after invalidating the token), 429, 5xx,
// any other status, timeouts and transport errors are retryable ("http_401",
// "http_429", "http_503", "timeout", "transport", ...), and a Retry-After
// header on 429 or 503 becomes the retry delay (outbox.RetryAfter). On 2xx
// the API's Results mode decides: with per-item results, SUCCESS and SKIPPED
// are sent (ProviderMessageID is the platform's resource id), BAD_REQUEST and
// FORBIDDEN fail permanently, every other status is retryable (the code is the
// status). A message whose content type is not JSON fails permanently
// (outbox.CodeNotJSON, "payload_not_json") and so does one whose Payload is
// not valid JSON ("invalid_payload"); neither is sent; a topic without a path fails
// permanently ("unknown_topic"). Error messages never contain the token.
//
// # Ordered groups
//
// The processor hands Publish one group's messages in order. They are sent in
// requests of BatchSize, one request after the other. When a message of a
// group (Group != "") fails retryably, no later request carries a message of
// that group: those messages get outbox.ErrNotAttempted, so the processor
// puts them back unattempted and FIFO holds between requests. Likewise when
// a whole request fails retryably (HTTP 5xx, 401, 429, a timeout), only the
// first message of each group in it gets the error; the group's later
// messages get outbox.ErrNotAttempted and do not use up their attempts
// because of the message ahead of them (unless Config.ChargeEveryItem, seed 004's
// behaviour: every item of the request is charged).
//
// Inside one request FIFO cannot be kept on a failure: FlowCatalyst
// processes every item of a batch, so item 5 may be stored while item 3 got
// a retryable INTERNAL_ERROR. The Publisher reports the truth (3 retried, 5
// sent), and item 3 then arrives after item 5. If a group must never be
// reordered, set BatchSize to 1 (one request per message: a failure stops the
// group before anything later is sent), at the cost of throughput. Whole-
// request failures (HTTP errors, timeouts) keep the order, since no item of
// the request is reported sent.
//
// # Cancellation
//
// Publish honours ctx: messages not yet sent when ctx ends get
// outbox.ErrNotAttempted (joined with ctx.Err()); a request in flight is
// aborted and its messages get a retryable error, since the server may have
// stored them.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	base    *url.URL
	api     API
	batch   int
	token   TokenSource
	client  *http.Client
	timeout time.Duration
	ua      string
	log     *slog.Logger
	// chargeAll: Config.ChargeEveryItem.
	chargeAll bool
}

// New returns a Publisher, or an error naming the first invalid Config field.
func New(cfg Config) (*Publisher, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("flowcatalyst: Config.BaseURL is required")
	}
	base, err := url.Parse(cfg.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, errors.New("flowcatalyst: Config.BaseURL must be an http(s) URL such as https://flowcatalyst.example.com")
	}
	if base.User != nil {
		return nil, errors.New("flowcatalyst: Config.BaseURL must not carry credentials; use Config.Token")
	}
	if base.RawQuery != "" || base.Fragment != "" {
		return nil, errors.New("flowcatalyst: Config.BaseURL must not have a query or fragment")
	}
	if cfg.API == (API{}) {
		cfg.API = CurrentAPI
	}
	if err := cfg.API.validate(); err != nil {
		return nil, fmt.Errorf("flowcatalyst: Config.%w", err)
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > cfg.API.MaxBatchSize {
		return nil, fmt.Errorf("flowcatalyst: Config.BatchSize must be between 1 and %d (the API's limit), got %d", cfg.API.MaxBatchSize, cfg.BatchSize)
	}
	if cfg.ConnectTimeout < 0 || cfg.RequestTimeout < 0 {
		return nil, errors.New("flowcatalyst: Config timeouts must not be negative")
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = newHTTPClient(cmp.Or(cfg.ConnectTimeout, DefaultConnectTimeout))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	base.RawPath = ""
	return &Publisher{
		base:      base,
		api:       cfg.API,
		batch:     cmp.Or(cfg.BatchSize, cfg.API.MaxBatchSize),
		token:     cfg.Token,
		client:    cfg.HTTPClient,
		timeout:   cmp.Or(cfg.RequestTimeout, DefaultRequestTimeout),
		ua:        cmp.Or(cfg.UserAgent, "outboxkit-flowcatalyst"),
		log:       cfg.Logger,
		chargeAll: cfg.ChargeEveryItem,
	}, nil
}

func newHTTPClient(connect time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   connect,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}}
}

// Topics returns the topics this Publisher has a path for, so that
// outbox.NewProcessor claims only those when Config.Topics is empty.
func (p *Publisher) Topics() []string { return p.api.Topics() }

// BatchSize returns the most items sent in one request.
func (p *Publisher) BatchSize() int { return p.batch }

// Publish sends msgs and returns one Result per message, in order. See
// Publisher for the outcomes, ordered groups and cancellation.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	out := make([]outbox.Result, len(msgs))
	// Split by endpoint, keeping order within each.
	byPath := map[string][]int{}
	var paths []string
	for i := range msgs {
		path := p.api.path(msgs[i].Topic)
		if path == "" {
			out[i].Err = outbox.Permanent("unknown_topic", fmt.Sprintf("topic %q has no FlowCatalyst endpoint", redact.Printable(msgs[i].Topic, 60)))
			continue
		}
		if err := outbox.RequireJSON(&msgs[i]); err != nil {
			out[i].Err = err
			continue
		}
		if !json.Valid(msgs[i].Payload) {
			out[i].Err = outbox.Permanent("invalid_payload", "the payload is not a JSON document")
			continue
		}
		if _, ok := byPath[path]; !ok {
			paths = append(paths, path)
		}
		byPath[path] = append(byPath[path], i)
	}
	for _, path := range paths {
		p.publishPath(ctx, path, msgs, byPath[path], out)
	}
	return out
}

// publishPath sends the messages at idx to path in requests of p.batch,
// stopping each group at its first retryable failure.
func (p *Publisher) publishPath(ctx context.Context, path string, msgs []outbox.Message, idx []int, out []outbox.Result) {
	blocked := map[string]bool{}
	chunk := make([]int, 0, min(p.batch, len(idx)))
	flush := func() {
		if len(chunk) == 0 {
			return
		}
		if err := ctx.Err(); err != nil {
			for _, i := range chunk {
				out[i].Err = notAttempted(err)
			}
		} else {
			p.send(ctx, path, msgs, chunk, out)
			for _, i := range chunk {
				if msgs[i].Group != "" && out[i].Err != nil && outbox.IsRetryable(out[i].Err) {
					blocked[msgs[i].GroupKey()] = true
				}
			}
		}
		chunk = chunk[:0]
	}
	for _, i := range idx {
		if msgs[i].Group != "" && blocked[msgs[i].GroupKey()] {
			out[i].Err = fmt.Errorf("%w: an earlier message of the group failed", outbox.ErrNotAttempted)
			continue
		}
		chunk = append(chunk, i)
		if len(chunk) == p.batch {
			flush()
		}
	}
	flush()
}

func notAttempted(ctxErr error) error {
	return errors.Join(outbox.ErrNotAttempted, ctxErr)
}

// send posts one request carrying the messages at idx and fills their
// results.
func (p *Publisher) send(ctx context.Context, path string, msgs []outbox.Message, idx []int, out []outbox.Result) {
	// failAll gives every message of the request err, except that a
	// retryable failure counts against only the first message of each
	// ordered group: the group's later messages are not attempted (they
	// wait behind the first anyway, and must not use up their attempts
	// because of it).
	failAll := func(err error) {
		retryable := outbox.IsRetryable(err) && !errors.Is(err, outbox.ErrNotAttempted)
		first := map[string]bool{}
		for _, i := range idx {
			if retryable && msgs[i].Group != "" && !p.chargeAll {
				k := msgs[i].GroupKey()
				if first[k] {
					out[i] = outbox.Result{Err: fmt.Errorf("%w: an earlier message of the group failed: %w", outbox.ErrNotAttempted, err)}
					continue
				}
				first[k] = true
			}
			out[i] = outbox.Result{Err: err}
		}
	}
	body := p.encode(msgs, idx)
	u := *p.base
	u.Path += path
	endpoint := u.String()

	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	token := ""
	if p.token != nil {
		t, err := p.token.Token(rctx)
		if err != nil {
			if ctx.Err() != nil {
				failAll(notAttempted(ctx.Err()))
				return
			}
			failAll(&outbox.PublishError{Code: "token", Message: redact.Printable(err.Error(), 500), Err: err})
			return
		}
		token = t
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		failAll(outbox.Permanent("bad_request", "cannot build the request: "+redact.Printable(err.Error(), 200)))
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", p.ua)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	started := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		code := "transport"
		switch {
		case ctx.Err() != nil:
			code = "canceled"
		case errors.Is(err, context.DeadlineExceeded) || httpx.IsTimeout(err):
			code = "timeout"
		}
		if code != "canceled" {
			p.log.WarnContext(ctx, "flowcatalyst request failed", "path", path, "items", len(idx), "code", code, "duration", time.Since(started))
		}
		failAll(&outbox.PublishError{Code: code, Message: "POST " + path + ": " + redact.Secrets(transportMessage(err), token), Err: ctx.Err()})
		return
	}
	defer drainClose(resp.Body)
	status := resp.StatusCode
	p.log.DebugContext(ctx, "flowcatalyst request", "path", path, "items", len(idx), "status", status, "duration", time.Since(started))

	if status >= 200 && status <= 299 {
		p.readSuccess(rctx, ctx, path, resp, msgs, idx, out, token)
		return
	}
	// An error response: read the envelope for the message.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	detail := errorDetail([]byte(redact.Secrets(string(raw), token)))
	msg := fmt.Sprintf("POST %s: HTTP %d", path, status)
	if detail != "" {
		msg += ": " + detail
	}
	code := "http_" + strconv.Itoa(status)
	p.log.WarnContext(ctx, "flowcatalyst request failed", "path", path, "items", len(idx), "status", status, "error", msg)
	switch {
	case status == http.StatusBadRequest || status == http.StatusForbidden:
		failAll(outbox.Permanent(code, msg))
	case status == http.StatusUnauthorized:
		if inv, ok := p.token.(interface{ Invalidate() }); ok {
			inv.Invalidate()
		}
		failAll(outbox.Retryable(code, msg))
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		failAll(outbox.RetryAfter(httpx.RetryAfter(resp.Header.Get("Retry-After"), time.Now(), maxRetryAfter), code, msg))
	default:
		failAll(outbox.Retryable(code, msg))
	}
}

// readSuccess fills the results of a 2xx response.
func (p *Publisher) readSuccess(rctx, ctx context.Context, path string, resp *http.Response, msgs []outbox.Message, idx []int, out []outbox.Result, token string) {
	if p.api.Results == ResultsIgnored {
		for _, i := range idx {
			out[i] = outbox.Result{}
		}
		return
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	var results []ItemResult
	var rawResults []json.RawMessage
	switch {
	case err != nil:
		code := "transport"
		if rctx.Err() != nil && ctx.Err() == nil {
			code = "timeout"
		}
		err = &outbox.PublishError{Code: code, Message: "POST " + path + ": reading the response: " + redact.Secrets(transportMessage(err), token), Err: ctx.Err()}
	case len(raw) > maxResponseBytes:
		err = outbox.Retryable("bad_response", fmt.Sprintf("POST %s: the response is larger than %d bytes", path, maxResponseBytes))
	default:
		var present bool
		results, rawResults, present, err = parseResults(raw, len(idx))
		if !present && p.api.Results == ResultsIfPresent {
			for _, i := range idx {
				out[i] = outbox.Result{}
			}
			return
		}
		if err != nil {
			p.log.WarnContext(ctx, "flowcatalyst response breaks the contract; retrying the batch", "path", path, "items", len(idx), "err", err)
			err = outbox.Retryable("bad_response", "POST "+path+": "+err.Error())
		}
	}
	if err != nil {
		for _, i := range idx {
			out[i] = outbox.Result{Err: err}
		}
		return
	}
	for j, i := range idx {
		r := results[j]
		res := outbox.Result{ProviderMessageID: redact.Secrets(r.ID, token), ProviderResponse: json.RawMessage(redact.Secrets(string(rawResults[j]), token))}
		switch {
		case r.Status.Sent():
		case r.Status.Permanent():
			res.Err = outbox.Permanent(string(r.Status), itemMessage(r, token))
		default:
			res.Err = outbox.Retryable(redact.Printable(redact.Secrets(string(r.Status), token), 40), itemMessage(r, token))
		}
		out[i] = res
	}
}

func itemMessage(r ItemResult, token string) string {
	s := "item " + redact.Printable(redact.Secrets(string(r.Status), token), 40)
	if r.Error != "" {
		s += ": " + redact.Printable(redact.Secrets(r.Error, token), 500)
	}
	return s
}

// parseResults reads a current-API batch response for n items. present
// reports whether the body is a JSON object with a "results" key. It returns
// an error unless there is exactly one well-formed result per item.
func parseResults(raw []byte, n int) (results []ItemResult, rawResults []json.RawMessage, present bool, err error) {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, nil, false, fmt.Errorf("the response is not a JSON object")
	}
	rr, ok := env["results"]
	if !ok {
		return nil, nil, false, fmt.Errorf("the response has no results")
	}
	if err := json.Unmarshal(rr, &rawResults); err != nil || rawResults == nil {
		return nil, nil, true, fmt.Errorf("the response's results is not an array")
	}
	if len(rawResults) != n {
		return nil, nil, true, fmt.Errorf("the response has %d results for %d items", len(rawResults), n)
	}
	results = make([]ItemResult, n)
	for i, r := range rawResults {
		if err := json.Unmarshal(r, &results[i]); err != nil {
			return nil, nil, true, fmt.Errorf("result %d is malformed", i)
		}
		if results[i].Status == "" {
			return nil, nil, true, fmt.Errorf("result %d has no status", i)
		}
		if !utf8.ValidString(results[i].ID) || len(results[i].ID) > outbox.MaxKeyLength {
			results[i].ID = redact.Printable(results[i].ID, outbox.MaxKeyLength)
		}
	}
	return results, rawResults, true, nil
}

// encode builds the request body from the payloads, verbatim.
func (p *Publisher) encode(msgs []outbox.Message, idx []int) []byte {
	size := 16
	for _, i := range idx {
		size += len(msgs[i].Payload) + 1
	}
	var b bytes.Buffer
	b.Grow(size)
	if p.api.Body == BodyItems {
		b.WriteString(`{"items":[`)
	} else {
		b.WriteByte('[')
	}
	for j, i := range idx {
		if j > 0 {
			b.WriteByte(',')
		}
		b.Write(bytes.TrimSpace(msgs[i].Payload))
	}
	b.WriteByte(']')
	if p.api.Body == BodyItems {
		b.WriteByte('}')
	}
	return b.Bytes()
}

// errorDetail extracts "CODE: message" from an error envelope, or a short
// sanitized excerpt of a non-JSON body.
func errorDetail(raw []byte) string {
	var e ErrorResponse
	if json.Unmarshal(raw, &e) == nil && (e.Error != "" || e.Message != "") {
		s := redact.Printable(e.Error, 100)
		if e.Message != "" {
			if s != "" {
				s += ": "
			}
			s += redact.Printable(e.Message, 400)
		}
		return s
	}
	return redact.Printable(string(raw), 200)
}

// transportMessage describes a transport error without the URL (the URL
// carries nothing secret, but the message is shorter without it).
func transportMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return redact.Printable(err.Error(), 300)
}

func drainClose(rc io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(rc, 64<<10))
	_ = rc.Close()
}
