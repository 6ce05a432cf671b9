package outbox

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Adapters wrap them with %w; test with errors.Is.
var (
	// ErrNotFound: no message with that ID (or provider message ID) in the
	// tenant.
	ErrNotFound = errors.New("outbox: message not found")
	// ErrInvalidInput: a message or parameter failed validation. The
	// concrete error is a *ValidationError.
	ErrInvalidInput = errors.New("outbox: invalid input")
	// ErrBlockedByPolicy: a Policy refused the message at enqueue. The
	// concrete error is a *PolicyError.
	ErrBlockedByPolicy = errors.New("outbox: blocked by policy")
	// ErrNoPublisher: a Router has no publisher for the message's topic.
	ErrNoPublisher = errors.New("outbox: no publisher for topic")
	// ErrNotAttempted is a publish Result error meaning "not sent, not
	// tried": the processor puts the message back without counting an
	// attempt. A publisher returns it for the rest of an ordered batch after
	// the first failure.
	ErrNotAttempted = errors.New("outbox: not attempted")
	// ErrClosed: the processor or store was closed.
	ErrClosed = errors.New("outbox: closed")
	// ErrPayloadTooLarge: a payload exceeds the configured limit
	// (Options.MaxPayloadBytes) or the store's ceiling. The concrete error
	// is a *PayloadTooLargeError; it also matches ErrInvalidInput.
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
)

// PayloadTooLargeError reports a payload above a size limit. It matches
// ErrPayloadTooLarge and ErrInvalidInput with errors.Is, and errors.As
// also fills a *ValidationError (Field "Payload") for code written before
// the limit was configurable.
type PayloadTooLargeError struct {
	// Size is the payload's length in bytes.
	Size int
	// Limit is the limit it exceeds, in bytes.
	Limit int
	// StoreCeiling is true when Limit is the store's hard ceiling
	// (PayloadLimiter) rather than Options.MaxPayloadBytes.
	StoreCeiling bool
}

func (e *PayloadTooLargeError) reason() string {
	if e.StoreCeiling {
		return fmt.Sprintf("is %d bytes, above the store's ceiling of %d bytes", e.Size, e.Limit)
	}
	return fmt.Sprintf("is %d bytes, above the limit of %d bytes (Options.MaxPayloadBytes)", e.Size, e.Limit)
}

func (e *PayloadTooLargeError) Error() string { return "outbox: invalid Payload: " + e.reason() }

// Is makes errors.Is(err, ErrPayloadTooLarge) and errors.Is(err,
// ErrInvalidInput) true.
func (e *PayloadTooLargeError) Is(target error) bool {
	return target == ErrPayloadTooLarge || target == ErrInvalidInput
}

// As fills a **ValidationError target with Field "Payload".
func (e *PayloadTooLargeError) As(target any) bool {
	if p, ok := target.(**ValidationError); ok {
		*p = &ValidationError{Field: "Payload", Reason: e.reason()}
		return true
	}
	return false
}

// ValidationError names the field that failed validation. It matches
// ErrInvalidInput with errors.Is.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox: invalid %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidInput }

func invalid(field, reason string) error { return &ValidationError{Field: field, Reason: reason} }

// InvalidParam returns a *ValidationError for a bad parameter. Adapters use
// it so their input errors look like the core's.
func InvalidParam(field, reason string) error { return invalid(field, reason) }

// PolicyError is returned by Enqueue when a Policy refuses a message. It
// matches ErrBlockedByPolicy.
type PolicyError struct {
	// Policy-provided code (e.g. "consent_required") and reason.
	Code   string
	Reason string
	// Index is the position of the refused message in the Enqueue call.
	Index int
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("outbox: message %d blocked by policy: %s: %s", e.Index, e.Code, e.Reason)
}

// Is makes errors.Is(err, ErrBlockedByPolicy) true.
func (e *PolicyError) Is(target error) bool { return target == ErrBlockedByPolicy }

// PublishError is the typed error a publisher returns for a message it could
// not publish. Code and Message are stored as the message's LastError, so
// they must not contain secrets.
type PublishError struct {
	// Code is the provider's error code ("131047", "http_503", ...).
	Code string
	// Message describes the failure.
	Message string
	// Permanent errors dead-letter the message at once; the others are
	// retried with backoff until MaxAttempts.
	Permanent bool
	// RetryAfter, when positive, replaces the backoff delay (a provider's
	// Retry-After or a throttle window).
	RetryAfter time.Duration
	// Err is the underlying error, if any. It is not stored.
	Err error
}

func (e *PublishError) Error() string {
	kind := "retryable"
	if e.Permanent {
		kind = "permanent"
	}
	s := fmt.Sprintf("publish failed (%s", kind)
	if e.Code != "" {
		s += ", code " + e.Code
	}
	s += ")"
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap returns the underlying error.
func (e *PublishError) Unwrap() error { return e.Err }

// Retryable reports whether the failure may succeed later.
func (e *PublishError) Retryable() bool { return !e.Permanent }

// RetryDelay returns RetryAfter.
func (e *PublishError) RetryDelay() time.Duration { return e.RetryAfter }

// Permanent returns a permanent publish error: the message is dead-lettered
// without further attempts.
func Permanent(code, message string) error {
	return &PublishError{Code: code, Message: message, Permanent: true}
}

// Retryable returns a retryable publish error: the message is retried after
// the backoff delay.
func Retryable(code, message string) error {
	return &PublishError{Code: code, Message: message}
}

// RetryAfter returns a retryable publish error that is retried after d
// rather than after the backoff delay.
func RetryAfter(d time.Duration, code, message string) error {
	return &PublishError{Code: code, Message: message, RetryAfter: d}
}

// DeferError asks the processor to try a message again after Delay without
// counting an attempt: the publisher did not (or could not usefully) send it,
// e.g. the tenant's quota is used up or the tenant is throttled. A deferred
// message is never dead-lettered for it. In an ordered group it holds back
// the group's later messages, like a retry. It matches ErrNotAttempted.
type DeferError struct {
	Delay   time.Duration
	Code    string
	Message string
}

func (e *DeferError) Error() string {
	return fmt.Sprintf("publish deferred for %s (code %s): %s", e.Delay, e.Code, e.Message)
}

// Is makes errors.Is(err, ErrNotAttempted) true.
func (e *DeferError) Is(target error) bool { return target == ErrNotAttempted }

// Retryable reports true: a deferred message is tried again.
func (e *DeferError) Retryable() bool { return true }

// RetryDelay returns Delay.
func (e *DeferError) RetryDelay() time.Duration { return e.Delay }

// Defer returns a *DeferError: try again after d, no attempt counted.
func Defer(d time.Duration, code, message string) error {
	return &DeferError{Delay: d, Code: code, Message: message}
}

// IsRetryable reports whether a publish error may succeed later. An error
// that says so through a Retryable() bool method (found with errors.As) is
// believed; any other error (a network error, a timeout) is retryable.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	var r interface{ Retryable() bool }
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return true
}

// RetryDelayOf returns the delay a publish error asks for (its RetryDelay()
// method, found with errors.As), or 0.
func RetryDelayOf(err error) time.Duration {
	var r interface{ RetryDelay() time.Duration }
	if errors.As(err, &r) {
		return r.RetryDelay()
	}
	return 0
}

// ErrorInfoOf turns a publish error into the ErrorInfo stored on the
// message: the PublishError's Code and Message when there is one, otherwise
// code "error" and err.Error() (truncated to 1,000 bytes).
func ErrorInfoOf(err error) *ErrorInfo {
	if err == nil {
		return nil
	}
	var pe *PublishError
	if errors.As(err, &pe) {
		return &ErrorInfo{Code: pe.Code, Message: truncate(pe.Message, 1000)}
	}
	var de *DeferError
	if errors.As(err, &de) {
		return &ErrorInfo{Code: de.Code, Message: truncate(de.Message, 1000)}
	}
	return &ErrorInfo{Code: "error", Message: truncate(err.Error(), 1000)}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 { // do not cut a UTF-8 sequence
		n--
	}
	return s[:n]
}
