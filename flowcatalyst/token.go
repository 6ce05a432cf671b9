package flowcatalyst

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// TokenSource supplies the bearer token of each request. The Publisher calls
// Token once per request; implementations cache. A TokenSource that also has
// an Invalidate() method has it called after an HTTP 401, so the next request
// fetches a fresh token. Implementations must be safe for concurrent use.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// StaticToken is a fixed bearer token. Its String and GoString methods
// return "[redacted]", so printing a Config does not reveal it.
type StaticToken string

// Token returns t.
func (t StaticToken) Token(context.Context) (string, error) { return string(t), nil }

// String returns "[redacted]".
func (t StaticToken) String() string { return "[redacted]" }

// GoString returns "[redacted]".
func (t StaticToken) GoString() string { return "[redacted]" }

// AuthStyle is how ClientCredentials authenticates to the token endpoint.
type AuthStyle int

const (
	// AuthStyleHeader sends the client id and secret as HTTP Basic
	// credentials (RFC 6749 section 2.3.1, the recommended way).
	AuthStyleHeader AuthStyle = iota
	// AuthStyleParams sends them as client_id and client_secret form
	// parameters.
	AuthStyleParams
)

// ClientCredentialsConfig configures an OAuth2 client-credentials
// TokenSource.
type ClientCredentialsConfig struct {
	// TokenURL is the token endpoint, e.g.
	// "https://flowcatalyst.example.com/oauth/token". Required.
	TokenURL string
	// ClientID and ClientSecret identify the client. ClientID is required.
	ClientID     string
	ClientSecret string
	// Scopes are requested as the space-separated "scope" parameter.
	// Defaults to none.
	Scopes []string
	// AuthStyle defaults to AuthStyleHeader.
	AuthStyle AuthStyle
	// RefreshBefore is how long before its expiry a cached token is
	// replaced. Defaults to 60s, capped at half the token's lifetime.
	RefreshBefore time.Duration
	// HTTPClient defaults to a client with a 10 s connect timeout.
	HTTPClient *http.Client
	// Timeout bounds one token request. Defaults to 30s.
	Timeout time.Duration
	// Clock decides expiry. Defaults to outbox.SystemClock.
	Clock outbox.Clock
}

// ClientCredentials is a TokenSource that fetches tokens from an OAuth2
// token endpoint with the client-credentials grant, caches each until shortly
// before it expires (a token without expires_in is kept until a 401
// invalidates it), and fetches at most one at a time: concurrent callers wait
// for the fetch in flight (or for their ctx). Fetch errors are
// *TokenError values and never contain the client secret or a token.
type ClientCredentials struct {
	cfg  ClientCredentialsConfig
	lock chan struct{} // held while reading or refreshing the cache

	token   string
	expires time.Time // zero: no known expiry
}

// NewClientCredentials returns a ClientCredentials TokenSource, or an error
// for an invalid configuration.
func NewClientCredentials(cfg ClientCredentialsConfig) (*ClientCredentials, error) {
	u, err := url.Parse(cfg.TokenURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("flowcatalyst: ClientCredentialsConfig.TokenURL must be an http(s) URL")
	}
	if cfg.ClientID == "" {
		return nil, errors.New("flowcatalyst: ClientCredentialsConfig.ClientID is required")
	}
	if cfg.AuthStyle != AuthStyleHeader && cfg.AuthStyle != AuthStyleParams {
		return nil, errors.New("flowcatalyst: ClientCredentialsConfig.AuthStyle is invalid")
	}
	if cfg.RefreshBefore < 0 || cfg.Timeout < 0 {
		return nil, errors.New("flowcatalyst: ClientCredentialsConfig durations must not be negative")
	}
	cfg.RefreshBefore = cmp.Or(cfg.RefreshBefore, time.Minute)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultRequestTimeout)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = newHTTPClient(DefaultConnectTimeout)
	}
	if cfg.Clock == nil {
		cfg.Clock = outbox.SystemClock
	}
	return &ClientCredentials{cfg: cfg, lock: make(chan struct{}, 1)}, nil
}

// Token returns the cached token, fetching a new one when there is none or
// it expires within RefreshBefore.
func (c *ClientCredentials) Token(ctx context.Context) (string, error) {
	select {
	case c.lock <- struct{}{}:
	case <-ctx.Done():
		return "", &TokenError{Message: "waiting for the token", Err: ctx.Err()}
	}
	defer func() { <-c.lock }()
	now := c.cfg.Clock.Now()
	if c.token != "" && (c.expires.IsZero() || now.Before(c.expires)) {
		return c.token, nil
	}
	tok, lifetime, err := c.fetch(ctx)
	if err != nil {
		return "", err
	}
	c.token, c.expires = tok, time.Time{}
	if lifetime > 0 {
		margin := min(c.cfg.RefreshBefore, lifetime/2)
		c.expires = c.cfg.Clock.Now().Add(lifetime - margin)
	}
	return tok, nil
}

// Invalidate drops the cached token: the next Token call fetches a new one.
// The Publisher calls it after an HTTP 401.
func (c *ClientCredentials) Invalidate() {
	c.lock <- struct{}{}
	c.token, c.expires = "", time.Time{}
	<-c.lock
}

type tokenResponse struct {
	AccessToken      string          `json:"access_token"`
	TokenType        string          `json:"token_type"`
	ExpiresIn        json.RawMessage `json:"expires_in"`
	Error            string          `json:"error"`
	ErrorDescription string          `json:"error_description"`
}

func (c *ClientCredentials) fetch(ctx context.Context) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	form := url.Values{"grant_type": {"client_credentials"}}
	if len(c.cfg.Scopes) > 0 {
		form.Set("scope", strings.Join(c.cfg.Scopes, " "))
	}
	if c.cfg.AuthStyle == AuthStyleParams {
		form.Set("client_id", c.cfg.ClientID)
		form.Set("client_secret", c.cfg.ClientSecret)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.TokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return "", 0, &TokenError{Message: "building the token request failed"}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if c.cfg.AuthStyle == AuthStyleHeader {
		req.SetBasicAuth(url.QueryEscape(c.cfg.ClientID), url.QueryEscape(c.cfg.ClientSecret))
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return "", 0, &TokenError{Message: "token request failed: " + c.redact(transportMessage(err)), Err: errors.Unwrap(err)}
	}
	defer drainClose(resp.Body)
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", 0, &TokenError{StatusCode: resp.StatusCode, Message: "reading the token response failed"}
	}
	var tr tokenResponse
	jsonErr := json.Unmarshal(body, &tr)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		te := &TokenError{StatusCode: resp.StatusCode, Message: fmt.Sprintf("token endpoint answered HTTP %d", resp.StatusCode)}
		if jsonErr == nil {
			te.Code = c.redact(redact.Printable(tr.Error, 100))
			te.Description = c.redact(redact.Printable(tr.ErrorDescription, 300))
		}
		return "", 0, te
	}
	if jsonErr != nil || tr.AccessToken == "" {
		return "", 0, &TokenError{StatusCode: resp.StatusCode, Message: "token response has no access_token"}
	}
	if tr.TokenType != "" && !strings.EqualFold(tr.TokenType, "bearer") {
		return "", 0, &TokenError{StatusCode: resp.StatusCode, Message: fmt.Sprintf("token type %q is not bearer", redact.Printable(tr.TokenType, 40))}
	}
	return tr.AccessToken, parseExpiresIn(tr.ExpiresIn), nil
}

// parseExpiresIn reads expires_in as a number or a numeric string (both are
// seen in the wild); anything else means "unknown".
func parseExpiresIn(raw json.RawMessage) time.Duration {
	if len(raw) == 0 {
		return 0
	}
	var n json.Number
	s := strings.Trim(string(raw), `"`)
	n = json.Number(s)
	f, err := n.Float64()
	if err != nil || f <= 0 || f > 365*24*3600 {
		return 0
	}
	return time.Duration(f * float64(time.Second))
}

func (c *ClientCredentials) redact(s string) string { return redact.Secrets(s, c.cfg.ClientSecret) }

// TokenError is returned by ClientCredentials.Token when no token could be
// had. It never contains the client secret or a token.
type TokenError struct {
	// StatusCode is the token endpoint's HTTP status; 0 when there was no
	// response.
	StatusCode int
	// Code and Description are the OAuth2 error and error_description, when
	// the endpoint sent them.
	Code        string
	Description string
	// Message says what went wrong.
	Message string
	// Err is the underlying error (a transport error or ctx.Err()).
	Err error
}

func (e *TokenError) Error() string {
	s := "flowcatalyst: token: " + e.Message
	if e.Code != "" {
		s += ": " + e.Code
	}
	if e.Description != "" {
		s += ": " + e.Description
	}
	if e.Err != nil && !strings.Contains(e.Message, e.Err.Error()) {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error.
func (e *TokenError) Unwrap() error { return e.Err }
