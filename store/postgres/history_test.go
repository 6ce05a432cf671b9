package postgres_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TestFirstSuccessWritesNoAttemptRow: a success at the first attempt is
// kept on the message row (no row in the attempts table, the common path's
// saving), and AttemptList still shows it, with its provider response; a
// retried message keeps one row per attempt; a requeue keeps the history,
// and the migration down turns the kept successes into attempt rows.
func TestFirstSuccessWritesNoAttemptRow(t *testing.T) {
	b := setup(t)
	rows := func() int {
		t.Helper()
		var n int
		if err := b.pg.Pool.QueryRow(b.ctx, "SELECT count(*) FROM "+b.store.AttemptsTable()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	en := b.enqueue(msg("t", "", 1), msg("t", "", 2))
	ms := b.claim("p", 2)
	if len(ms) != 2 {
		t.Fatalf("claimed %d", len(ms))
	}
	started := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)
	p := outbox.MessageFinishParams{Owner: "p", Now: time.Now(),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: en[0].Message.ID, Attempt: 1, ClaimToken: ms[0].ClaimToken, ProviderMessageID: "x1", ProviderResponse: json.RawMessage(`{"ok":1}`), StartedAt: started},
			{Kind: outbox.OutcomeRetry, ID: en[1].Message.ID, Attempt: 1, ClaimToken: ms[1].ClaimToken, Error: &outbox.ErrorInfo{Code: "c"}}}}
	if _, err := b.store.MessageFinish(b.ctx, p); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d attempt rows after one first-attempt success and one retry, want 1 (the retry)", n)
	}
	as, err := b.store.AttemptList(b.ctx, outbox.AttemptListParams{MessageID: en[0].Message.ID})
	if err != nil || len(as) != 1 || as[0].Number != 1 || as[0].Outcome != outbox.AttemptSucceeded ||
		string(as[0].ProviderResponse) != `{"ok":1}` || !as[0].StartedAt.Equal(started) || as[0].FinishedAt.IsZero() {
		t.Fatalf("attempts of the first-attempt success: %+v, %v", as, err)
	}
	// The retried message succeeds at attempt 2: a row, as for every
	// attempt after the first.
	ms = b.claim("p", 1)
	b.sent("p", ms...)
	if as, _ := b.store.AttemptList(b.ctx, outbox.AttemptListParams{MessageID: en[1].Message.ID}); len(as) != 2 ||
		as[0].Outcome != outbox.AttemptRetry || as[1].Outcome != outbox.AttemptSucceeded || as[1].Number != 2 {
		t.Fatalf("attempts of the retried message: %+v", as)
	}
	if n := rows(); n != 2 {
		t.Fatalf("%d attempt rows, want 2", n)
	}
	// Migrating down to version 3 keeps the first success as a row.
	if err := b.store.MigrateTo(b.ctx, 3); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 3 {
		t.Fatalf("%d attempt rows after migrating down, want 3", n)
	}
	if err := b.store.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	if as, _ := b.store.AttemptList(b.ctx, outbox.AttemptListParams{MessageID: en[0].Message.ID}); len(as) != 1 || string(as[0].ProviderResponse) != `{"ok":1}` {
		t.Fatalf("attempts after migrating down and up: %+v", as)
	}
}
