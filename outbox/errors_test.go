package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestErrorClassification(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		err       error
		retryable bool
		delay     time.Duration
		code      string
	}{
		{"permanent", Permanent("131047", "window closed"), false, 0, "131047"},
		{"retryable", Retryable("131000", "try later"), true, 0, "131000"},
		{"retry after", RetryAfter(90*time.Second, "130429", "throughput"), true, 90 * time.Second, "130429"},
		{"wrapped permanent", fmt.Errorf("send: %w", Permanent("400", "bad")), false, 0, "400"},
		{"plain error", errors.New("connection reset"), true, 0, "error"},
		{"deadline", context.DeadlineExceeded, true, 0, "error"},
	}
	for _, c := range cases {
		if got := IsRetryable(c.err); got != c.retryable {
			t.Errorf("%s: IsRetryable = %v", c.name, got)
		}
		if got := RetryDelayOf(c.err); got != c.delay {
			t.Errorf("%s: RetryDelayOf = %s", c.name, got)
		}
		if got := ErrorInfoOf(c.err); got.Code != c.code {
			t.Errorf("%s: ErrorInfoOf code = %q", c.name, got.Code)
		}
	}
	if IsRetryable(nil) || ErrorInfoOf(nil) != nil {
		t.Error("nil error")
	}
	inner := errors.New("dial tcp: refused")
	pe := &PublishError{Code: "x", Err: inner}
	if !errors.Is(pe, inner) {
		t.Error("PublishError must unwrap")
	}
	long := ErrorInfoOf(errors.New(strings.Repeat("é", 2000)))
	if len(long.Message) > 1000 || !strings.HasPrefix(long.Message, "é") || strings.ContainsRune(long.Message, '\uFFFD') {
		t.Errorf("truncation broke the message: %d bytes", len(long.Message))
	}
}

func TestValidationAndPolicyErrors(t *testing.T) {
	t.Parallel()
	var ve *ValidationError
	err := ValidateMessage(&Message{Payload: []byte(`{}`)})
	if !errors.Is(err, ErrInvalidInput) || !errors.As(err, &ve) || ve.Field != "Topic" {
		t.Fatalf("missing topic: %v", err)
	}
	pe := &PolicyError{Code: "consent_required", Reason: "no consent"}
	if !errors.Is(pe, ErrBlockedByPolicy) {
		t.Fatal("PolicyError must match ErrBlockedByPolicy")
	}
}

func TestDeferError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("quota: %w", Defer(time.Hour, "quota_exceeded", "1000 of 1000 used"))
	var de *DeferError
	if !errors.As(err, &de) || !errors.Is(err, ErrNotAttempted) || !IsRetryable(err) || RetryDelayOf(err) != time.Hour {
		t.Fatalf("defer error: %v", err)
	}
	if info := ErrorInfoOf(err); info.Code != "quota_exceeded" {
		t.Fatalf("ErrorInfoOf: %+v", info)
	}
}
