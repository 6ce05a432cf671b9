package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOutcomeValidate: every kind accepts the fields it records and refuses,
// naming the field, what it would silently drop.
func TestOutcomeValidate(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := &ErrorInfo{Code: "http_503", Message: "unavailable"}
	resp := json.RawMessage(`{"ok":true}`)
	valid := []Outcome{
		{Kind: OutcomeSent, ID: "a", Attempt: 1, ProviderMessageID: "wamid.1", ProviderResponse: resp, StartedAt: at},
		{Kind: OutcomeRetry, ID: "a", Attempt: 2, NextAttemptAt: at, Error: e, ProviderResponse: resp, StartedAt: at},
		{Kind: OutcomeRetry, ID: "a", Attempt: 2, Error: e}, // due at once
		{Kind: OutcomeDead, ID: "a", Attempt: 6, Error: e, ProviderResponse: resp, StartedAt: at},
		{Kind: OutcomeReleased, ID: "a", Attempt: 1},
		{Kind: OutcomeReleased, ID: "a", Attempt: 1, NextAttemptAt: at, Error: e}, // a deferral
	}
	for _, o := range valid {
		require.NoError(t, o.Validate(), "%+v", o)
	}
	invalid := []struct {
		field string
		o     Outcome
	}{
		{"Kind", Outcome{ID: "a", Attempt: 1}},
		{"Kind", Outcome{Kind: "SENT", ID: "a", Attempt: 1}},
		{"ID", Outcome{Kind: OutcomeSent, Attempt: 1}},
		{"Attempt", Outcome{Kind: OutcomeSent, ID: "a"}},
		{"Error", Outcome{Kind: OutcomeSent, ID: "a", Attempt: 1, Error: e}},
		{"NextAttemptAt", Outcome{Kind: OutcomeSent, ID: "a", Attempt: 1, NextAttemptAt: at}},
		{"Error", Outcome{Kind: OutcomeRetry, ID: "a", Attempt: 1, NextAttemptAt: at}},
		{"ProviderMessageID", Outcome{Kind: OutcomeRetry, ID: "a", Attempt: 1, Error: e, ProviderMessageID: "x"}},
		{"Error", Outcome{Kind: OutcomeDead, ID: "a", Attempt: 1}},
		{"NextAttemptAt", Outcome{Kind: OutcomeDead, ID: "a", Attempt: 1, Error: e, NextAttemptAt: at}},
		{"ProviderMessageID", Outcome{Kind: OutcomeDead, ID: "a", Attempt: 1, Error: e, ProviderMessageID: "x"}},
		{"Error", Outcome{Kind: OutcomeReleased, ID: "a", Attempt: 1, Error: e}},
		{"ProviderMessageID", Outcome{Kind: OutcomeReleased, ID: "a", Attempt: 1, ProviderMessageID: "x"}},
		{"ProviderResponse", Outcome{Kind: OutcomeReleased, ID: "a", Attempt: 1, ProviderResponse: resp}},
	}
	for _, c := range invalid {
		err := c.o.Validate()
		require.ErrorIs(t, err, ErrInvalidInput, "%+v was accepted", c.o)
		var ve *ValidationError
		require.True(t, errors.As(err, &ve))
		require.Equal(t, c.field, ve.Field, "%+v: %v", c.o, err)
	}
}

// TestMessageFinishParamsValidate: the error names the outcome by its
// index, and one message may not have two outcomes in a call; the same ID
// under two topics is two messages (stores with one table per topic).
func TestMessageFinishParamsValidate(t *testing.T) {
	t.Parallel()
	sent := func(topic, id string) Outcome { return Outcome{Kind: OutcomeSent, Topic: topic, ID: id, Attempt: 1} }
	require.NoError(t, MessageFinishParams{Owner: "p"}.Validate())
	require.NoError(t, MessageFinishParams{Owner: "p", Outcomes: []Outcome{sent("events", "1"), sent("jobs", "1")}}.Validate())

	var ve *ValidationError
	err := MessageFinishParams{Outcomes: []Outcome{sent("", "1")}}.Validate()
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Owner", ve.Field)

	err = MessageFinishParams{Owner: "p", Outcomes: []Outcome{sent("", "1"), {Kind: OutcomeDead, ID: "2", Attempt: 1}}}.Validate()
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Outcomes[1].Error", ve.Field)

	err = MessageFinishParams{Owner: "p", Outcomes: []Outcome{sent("t", "1"), sent("t", "2"), sent("t", "1")}}.Validate()
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Outcomes[2].ID", ve.Field)
}

func TestOutcomeKindAttemptOutcome(t *testing.T) {
	t.Parallel()
	for k, want := range map[OutcomeKind]AttemptOutcome{OutcomeSent: AttemptSucceeded, OutcomeRetry: AttemptRetry, OutcomeDead: AttemptFailed} {
		got, ok := k.AttemptOutcome()
		require.True(t, ok, k)
		require.Equal(t, want, got, k)
	}
	_, ok := OutcomeReleased.AttemptOutcome()
	require.False(t, ok, "a release records no attempt")
}

// TestPrepareTakesOutboxBatchOnly: Prepare validates every message of a
// direct caller's params, takes the messages Outbox prepared as they are,
// and validates again when a wrapper swapped Messages for another slice.
func TestPrepareTakesOutboxBatchOnly(t *testing.T) {
	now := time.Date(2026, 11, 28, 15, 0, 0, 123456789, time.UTC)
	direct := MessageEnqueueParams{Messages: []Message{{Topic: "t", Payload: json.RawMessage(`1`), Status: StatusSent}}}
	got, err := direct.Prepare(now, time.Microsecond, 0)
	if err != nil || got[0].Status != StatusPending || got[0].ID == "" || !got[0].CreatedAt.Equal(now.Truncate(time.Microsecond)) {
		t.Fatalf("direct Prepare: %+v, %v", got, err)
	}
	if direct.Messages[0].ID != "" {
		t.Fatal("Prepare changed the caller's message")
	}

	ob := New[struct{}](nil, Options{Clock: fixedNow(now)})
	p, err := ob.prepare(context.Background(), []Message{{Topic: "t", Payload: json.RawMessage(`2`)}})
	if err != nil {
		t.Fatal(err)
	}
	// Outbox's batch is taken as it is: a field set after its preparation
	// stays (a direct caller's would be reset).
	p.Messages[0].Attempts = 3
	got, err = p.Prepare(now, time.Microsecond, 0)
	if err != nil || got[0].Attempts != 3 || !got[0].IDGenerated() {
		t.Fatalf("Prepare of Outbox's batch: %+v, %v; want it taken as it is", got, err)
	}

	// A wrapper that hands over another slice is a direct caller.
	swapped := p
	swapped.Messages = []Message{{Topic: "", Payload: json.RawMessage(`3`)}}
	if _, err := swapped.Prepare(now, time.Microsecond, 0); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("Prepare of a swapped slice: %v; want it validated", err)
	}
	p.Messages[0].Payload = make([]byte, 11)
	if _, err := p.Prepare(now, time.Microsecond, 10); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("Prepare above the ceiling: %v; want a *PayloadTooLargeError", err)
	}
}

type fixedNow time.Time

func (c fixedNow) Now() time.Time { return time.Time(c) }
