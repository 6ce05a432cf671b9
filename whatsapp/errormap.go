package whatsapp

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// Scope says what a rate-limit error throttles.
type Scope int

// The throttle scopes of an ErrorSpec.
const (
	// ScopeNone: not a rate limit; nothing is throttled.
	ScopeNone Scope = iota
	// ScopeTenant: the tenant (its business number or account) is throttled
	// until the retry-after: its other messages wait too.
	ScopeTenant
	// ScopeRecipient: only the (tenant, recipient) pair is throttled, as for
	// Meta's pair rate limit (131056); other recipients are unaffected.
	ScopeRecipient
	// ScopeCredentials: the tenant's credentials are rejected (an expired
	// or revoked token): the tenant's sends pause, every message deferred,
	// until its CredentialsProvider returns different credentials.
	ScopeCredentials
)

// ErrorSpec says what to do about one Cloud API error code.
type ErrorSpec struct {
	// Code is Meta's error.code.
	Code int
	// Description is a short human description, stored with the error.
	Description string
	// Retryable errors are retried (with backoff or RetryAfter); the others
	// dead-letter the message at once.
	Retryable bool
	// RateLimit says whether and what the error throttles. Rate-limit errors
	// are always retried, whatever Retryable says, and do not count as
	// attempts: the message is deferred (outbox.Defer) until the throttle
	// ends, so it is never dead-lettered for a rate limit.
	RateLimit Scope
	// RetryAfter, when positive, replaces the processor's backoff delay
	// (and is the throttle window and deferral for rate limits) unless the
	// response carried a Retry-After header.
	RetryAfter time.Duration
}

// ErrorMap classifies Cloud API error codes. The zero value is empty (every
// code unknown); DefaultErrorMap returns the map of seed 002 and Meta's
// current error-code reference. It is safe for concurrent use; a host may
// override entries with Set.
type ErrorMap struct {
	mu sync.RWMutex
	m  map[int]ErrorSpec
}

// defaultSpecs is Meta's current error-code reference, with the seed's codes
// that the reference does not list. Where the seed and the reference differ
// on a code's meaning the reference wins (e.g. 131000 "something went wrong"
// is retryable, 131026 "undeliverable" is not, 133004 is a temporary server
// error, 190 needs a new token).
var defaultSpecs = []ErrorSpec{
	{Code: 0, Description: "authentication error: access token expired, invalid or revoked", RateLimit: ScopeCredentials},
	{Code: 1, Description: "API unknown: invalid request or possible server error", Retryable: true},
	{Code: 2, Description: "API service: temporary downtime or overload", Retryable: true},
	{Code: 3, Description: "API method: capability or permission issue"},
	{Code: 4, Description: "application API call rate limit reached", Retryable: true, RateLimit: ScopeTenant, RetryAfter: 5 * time.Minute},
	{Code: 5, Description: "permanent phone error"},
	{Code: 10, Description: "permission denied"},
	{Code: 33, Description: "business phone number deleted"},
	{Code: 100, Description: "invalid or misspelled parameter"},
	{Code: 190, Description: "access token expired: a new token is needed", RateLimit: ScopeCredentials},
	{Code: 200, Description: "API permission error"},
	{Code: 368, Description: "temporarily blocked for a policy violation"},
	{Code: 470, Description: "message expired: outside the 24-hour window (legacy, now 131047)"},
	{Code: 471, Description: "spam rate limit (legacy, now 131048)", Retryable: true, RateLimit: ScopeTenant, RetryAfter: time.Hour},
	{Code: 80007, Description: "WhatsApp Business Account rate limit reached", Retryable: true, RateLimit: ScopeTenant, RetryAfter: 5 * time.Minute},
	{Code: 130403, Description: "the business has blocked this user"},
	{Code: 130429, Description: "Cloud API throughput rate limit reached", Retryable: true, RateLimit: ScopeTenant, RetryAfter: 5 * time.Second},
	{Code: 130472, Description: "user is part of a marketing experiment"},
	{Code: 130497, Description: "business account restricted from messaging users in this country"},
	{Code: 131000, Description: "something went wrong (unknown error)", Retryable: true},
	{Code: 131005, Description: "access denied"},
	{Code: 131008, Description: "required parameter missing"},
	{Code: 131009, Description: "parameter value invalid"},
	{Code: 131016, Description: "service unavailable", Retryable: true},
	{Code: 131021, Description: "recipient is the sender"},
	{Code: 131026, Description: "message undeliverable: recipient not on WhatsApp, old client or terms not accepted"},
	{Code: 131031, Description: "business account locked"},
	{Code: 131037, Description: "555 number has no approved display name"},
	{Code: 131042, Description: "business payment or billing problem"},
	{Code: 131045, Description: "phone number registration error"},
	{Code: 131047, Description: "re-engagement message: more than 24 hours since the recipient last replied; send a template"},
	{Code: 131048, Description: "spam rate limit: messages restricted because of quality", Retryable: true, RateLimit: ScopeTenant, RetryAfter: time.Hour},
	{Code: 131049, Description: "not delivered to maintain a healthy ecosystem (per-user marketing limit); wait 24 hours", Retryable: true, RetryAfter: 24 * time.Hour},
	{Code: 131050, Description: "user stopped marketing messages"},
	{Code: 131051, Description: "unsupported message type"},
	{Code: 131052, Description: "media download error"},
	{Code: 131053, Description: "media upload error"},
	{Code: 131056, Description: "pair rate limit: too many messages to the same recipient", Retryable: true, RateLimit: ScopeRecipient},
	{Code: 131057, Description: "business account in maintenance mode (throughput upgrade)", Retryable: true, RetryAfter: time.Minute},
	{Code: 131063, Description: "marketing template disabled on Cloud API"},
	{Code: 131064, Description: "messaging limited because of template misclassification", Retryable: true, RateLimit: ScopeTenant, RetryAfter: 6 * time.Hour},
	{Code: 132000, Description: "template parameter count mismatch"},
	{Code: 132001, Description: "template does not exist in this language or is not approved"},
	{Code: 132005, Description: "template hydrated text too long"},
	{Code: 132007, Description: "template violates a policy"},
	{Code: 132012, Description: "template parameter format mismatch"},
	{Code: 132015, Description: "template paused for low quality"},
	{Code: 132016, Description: "template permanently disabled"},
	{Code: 132068, Description: "flow blocked"},
	{Code: 132069, Description: "flow throttled (10 messages per flow per hour)", Retryable: true, RetryAfter: time.Hour},
	{Code: 133000, Description: "incomplete deregistration"},
	{Code: 133004, Description: "server temporarily unavailable", Retryable: true},
	{Code: 133005, Description: "two-step verification PIN mismatch"},
	{Code: 133006, Description: "phone number needs to be verified again"},
	{Code: 133008, Description: "too many two-step verification PIN guesses", Retryable: true, RetryAfter: time.Hour},
	{Code: 133009, Description: "two-step verification PIN entered too fast", Retryable: true, RetryAfter: time.Minute},
	{Code: 133010, Description: "phone number not registered"},
	{Code: 133015, Description: "phone number recently deleted; wait 5 minutes", Retryable: true, RetryAfter: 5 * time.Minute},
	{Code: 133016, Description: "register/deregister rate limit", Retryable: true, RateLimit: ScopeTenant, RetryAfter: time.Hour},
	{Code: 134011, Description: "payments terms of service pending"},
	{Code: 135000, Description: "generic user error"},
}

// DefaultErrorMap returns a new map with every code of seed 002's table and
// Meta's error-code reference.
func DefaultErrorMap() *ErrorMap {
	m := &ErrorMap{m: make(map[int]ErrorSpec, len(defaultSpecs))}
	for _, s := range defaultSpecs {
		m.m[s.Code] = s
	}
	return m
}

// Set adds or replaces the entry for s.Code.
func (m *ErrorMap) Set(s ErrorSpec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[int]ErrorSpec{}
	}
	m.m[s.Code] = s
}

// Lookup returns the entry for code, if there is one.
func (m *ErrorMap) Lookup(code int) (ErrorSpec, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s, ok := m.m[code]
	return s, ok
}

// Codes returns the codes in the map, sorted.
func (m *ErrorMap) Codes() []int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Sorted(maps.Keys(m.m))
}

// Classify returns the spec for an error with code and error_data.details.
// Unknown codes are retryable, except the permission range 200–299, which is
// permanent; an unknown code whose details speak of a rate limit or
// throughput throttles the tenant.
func (m *ErrorMap) Classify(code int, details string) ErrorSpec {
	if s, ok := m.Lookup(code); ok {
		return s
	}
	if code >= 200 && code <= 299 {
		return ErrorSpec{Code: code, Description: "API permission error"}
	}
	d := strings.ToLower(details)
	if strings.Contains(d, "rate limit") || strings.Contains(d, "throughput") {
		return ErrorSpec{Code: code, Description: "rate limit", Retryable: true, RateLimit: ScopeTenant, RetryAfter: time.Minute}
	}
	return ErrorSpec{Code: code, Description: "unknown error code " + strconv.Itoa(code), Retryable: true}
}

// ErrorClass is a deployment's own decision about an error code, over the
// map's: whether a message that gets it is tried again or fails at once.
type ErrorClass string

// The classes a deployment may give a code (Config.ErrorClasses).
const (
	// ClassRetryable: the message is retried with the processor's backoff,
	// the attempt counted. A rate-limit code keeps its throttle.
	ClassRetryable ErrorClass = "retryable"
	// ClassPermanent: the message fails at once (dead letter). A
	// rate-limit or credentials code loses its throttle or pause.
	ClassPermanent ErrorClass = "permanent"
)

// ParseErrorClasses parses a deployment's overrides, written as
// "131026=retryable,133004=permanent" (commas or white space between the
// entries), for Config.ErrorClasses. It refuses a code that is not a
// number, a class that is neither retryable nor permanent, and a code given
// twice.
func ParseErrorClasses(s string) (map[int]ErrorClass, error) {
	out := map[int]ErrorClass{}
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		codeStr, class, ok := strings.Cut(f, "=")
		code, err := strconv.Atoi(strings.TrimSpace(codeStr))
		if !ok || err != nil || code < 0 {
			return nil, outbox.InvalidParam("error classes", fmt.Sprintf("%q is not CODE=retryable or CODE=permanent", f))
		}
		c := ErrorClass(strings.ToLower(strings.TrimSpace(class)))
		if c != ClassRetryable && c != ClassPermanent {
			return nil, outbox.InvalidParam("error classes", fmt.Sprintf("%q: the class must be retryable or permanent", f))
		}
		if _, dup := out[code]; dup {
			return nil, outbox.InvalidParam("error classes", fmt.Sprintf("code %d is given twice", code))
		}
		out[code] = c
	}
	return out, nil
}

// WithClasses returns a copy of m in which each code of classes has that
// class; m itself is unchanged. A code the map does not know gets an entry
// of its own.
func (m *ErrorMap) WithClasses(classes map[int]ErrorClass) (*ErrorMap, error) {
	m.mu.RLock()
	c := &ErrorMap{m: maps.Clone(m.m)}
	m.mu.RUnlock()
	if c.m == nil {
		c.m = map[int]ErrorSpec{}
	}
	for code, class := range classes {
		s := c.Classify(code, "")
		switch class {
		case ClassRetryable:
			s.Retryable = true
		case ClassPermanent:
			s.Retryable, s.RateLimit, s.RetryAfter = false, ScopeNone, 0
		default:
			return nil, outbox.InvalidParam("Config.ErrorClasses", fmt.Sprintf("code %d: unknown class %q (retryable or permanent)", code, class))
		}
		s.Code = code
		s.Description += " (class " + string(class) + " by configuration)"
		c.m[code] = s
	}
	return c, nil
}

// Class is the class the spec gives its code: "rate limit" (deferred, no
// attempt counted, the tenant or recipient throttled), "paused" (deferred
// until the tenant's credentials change), "retryable" or "permanent".
func (s ErrorSpec) Class() string {
	switch {
	case s.RateLimit == ScopeCredentials:
		return "paused"
	case s.RateLimit != ScopeNone:
		return "rate limit"
	case s.Retryable:
		return "retryable"
	default:
		return "permanent"
	}
}
