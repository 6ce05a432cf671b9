package logdesign_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
	"github.com/outboxkit/outboxkit/store/postgres/internal/logdesign"
)

// TestMigrateKeepsEveryState fills a store with messages in every state
// through its own API (sent with a provider ID, delivered, cancelled, a
// live lease, waiting behind a lease, a dead letter holding its group and
// one not, a retry waiting, unordered ones in each), applies the design's
// SQL, and checks that the derived state of every message is the store's:
// status, whether it holds its group, its provider ID and, for a retry
// waiting at its group's head, its attempts.
func TestMigrateKeepsEveryState(t *testing.T) {
	pg := testbackend.Postgres(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name})
	if err != nil {
		t.Fatal(err)
	}
	// The design's SQL maps the schema of version 12 (the store's own
	// append-only path, migration 13, keeps the rows instead and adds
	// marks of its own).
	if err := s.MigrateTo(ctx, 12); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	var msgs []outbox.Message
	for _, g := range []struct {
		group string
		n     int
	}{{"a", 5}, {"b", 3}, {"c", 3}, {"", 6}} {
		for i := 1; i <= g.n; i++ {
			msgs = append(msgs, outbox.Message{Topic: "t", Group: g.group, IdempotencyKey: fmt.Sprintf("%s%d", cmp.Or(g.group, "u"), i),
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		}
	}
	if _, err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claimed := map[string]outbox.Message{} // by idempotency key
	claim := func() {
		ms, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Owner: "p", Limit: 100, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			claimed[m.IdempotencyKey] = m
		}
	}
	finish := func(outcomes map[string]outbox.Outcome) {
		p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
		for key, o := range outcomes {
			m, ok := claimed[key]
			if !ok {
				t.Fatalf("%s was not claimed", key)
			}
			o.ID, o.Topic, o.Attempt, o.ClaimToken = m.ID, m.Topic, m.Attempts, m.ClaimToken
			p.Outcomes = append(p.Outcomes, o)
		}
		res, err := s.MessageFinish(ctx, p)
		if err != nil || len(res.LeaseLost) > 0 {
			t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
		}
	}
	sent := func(key string) outbox.Outcome {
		return outbox.Outcome{Kind: outbox.OutcomeSent, ProviderMessageID: "p-" + key}
	}
	failed := &outbox.ErrorInfo{Code: "x", Message: "failed"}
	released := outbox.Outcome{Kind: outbox.OutcomeReleased}
	claim()
	finish(map[string]outbox.Outcome{
		"a1": sent("a1"), "a2": sent("a2"), "a3": released, "a4": released, "a5": released,
		"b1": sent("b1"), "b2": {Kind: outbox.OutcomeDead, Error: failed, BlockGroup: true}, "b3": released,
		"c1": {Kind: outbox.OutcomeDead, Error: failed}, "c2": {Kind: outbox.OutcomeRetry, Error: failed, NextAttemptAt: now.Add(time.Hour)}, "c3": released,
		"u1": sent("u1"), "u3": released, "u4": released, "u5": {Kind: outbox.OutcomeDead, Error: failed},
		"u6": {Kind: outbox.OutcomeRetry, Error: failed, NextAttemptAt: now.Add(time.Hour)},
	})
	if _, err := s.MessageApplyReceipt(ctx, outbox.MessageApplyReceiptParams{Receipt: outbox.Receipt{ProviderMessageID: "p-a2", Status: outbox.DeliveryDelivered}}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a3", "u4"} {
		if _, err := s.MessageCancel(ctx, outbox.MessageCancelParams{ID: claimed[key].ID, Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	claim() // a4 and a5 (a3 is cancelled), u3; b3 is held, c3 waits behind c2's retry
	finish(map[string]outbox.Outcome{"a5": released})

	// The store's view of every message, before the SQL.
	want := map[string]outbox.Message{}
	statuses := map[outbox.Status]bool{}
	for key, m := range claimed {
		got, err := s.MessageGet(ctx, outbox.MessageGetParams{ID: m.ID})
		if err != nil {
			t.Fatal(err)
		}
		want[key] = got
		statuses[got.Status] = true
	}
	if len(want) != len(msgs) {
		t.Fatalf("%d of %d messages were claimed: the states above were not all reached", len(want), len(msgs))
	}
	for _, st := range []outbox.Status{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusSent, outbox.StatusDelivered, outbox.StatusFailed, outbox.StatusCancelled} {
		if !statuses[st] {
			t.Fatalf("no message is %s: the test does not cover every state", st)
		}
	}

	if _, err := pg.Pool.Exec(ctx, strings.NewReplacer("{{schema}}", pg.Name, "{{prefix}}", "outbox_").Replace(logdesign.MigrateSQL)); err != nil {
		t.Fatal(err)
	}
	rows, err := pg.Pool.Query(ctx, fmt.Sprintf(`SELECT id, status, blocks_group, head_attempts, coalesce(provider_message_id, '') FROM %s.outbox_message_state`, pg.Name))
	if err != nil {
		t.Fatal(err)
	}
	derived := map[string]outbox.Message{}
	for rows.Next() {
		var m outbox.Message
		if err := rows.Scan(&m.ID, &m.Status, &m.BlocksGroup, &m.Attempts, &m.ProviderMessageID); err != nil {
			t.Fatal(err)
		}
		derived[m.ID] = m
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, w := range want {
		d, ok := derived[w.ID]
		if !ok {
			t.Errorf("%s: no derived state", key)
			continue
		}
		if d.Status != w.Status || d.BlocksGroup != w.BlocksGroup || d.ProviderMessageID != w.ProviderMessageID {
			t.Errorf("%s: derived %s (holds group %v, provider %q), the store says %s (%v, %q)",
				key, d.Status, d.BlocksGroup, d.ProviderMessageID, w.Status, w.BlocksGroup, w.ProviderMessageID)
		}
		if w.Status == outbox.StatusPending && w.Attempts > 0 && d.Attempts != w.Attempts {
			t.Errorf("%s: a retry waiting with %d attempts, derived %d", key, w.Attempts, d.Attempts)
		}
	}
}
