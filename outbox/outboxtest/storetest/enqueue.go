package storetest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

func testEnqueue[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("CommitInTxStoresEveryField", func(t *testing.T) {
		need(t, h, CapTenants, CapIdempotency)
		e := setup(t, h)
		tx := e.begin()
		in := outbox.Message{
			Tenant: "acme", Topic: "whatsapp", Group: "dossier-1", IdempotencyKey: "order-1",
			Payload: json.RawMessage(`{"to": "+31600000000", "template": "hello"}`),
			Headers: map[string]string{"traceparent": "00-abc-def-01"}, MaxAttempts: 3,
		}
		res, err := e.ob.EnqueueTx(e.ctx, tx, in)
		require.NoError(t, err, "EnqueueTx")
		e.commit(tx)
		if len(res) != 1 || res[0].Existed {
			t.Fatalf("EnqueueTx: %+v, want one new message", res)
		}
		m := e.get("acme", res[0].Message.ID)
		if m.Tenant != in.Tenant || m.Topic != in.Topic || m.Group != in.Group || m.IdempotencyKey != in.IdempotencyKey ||
			m.MaxAttempts != 3 || m.Headers["traceparent"] != "00-abc-def-01" || len(m.Headers) != 1 {
			t.Fatalf("stored message %+v does not match %+v", m, in)
		}
		if !jsonEqual(m.Payload, in.Payload) {
			t.Fatalf("payload %s, want %s", m.Payload, in.Payload)
		}
		if m.Status != outbox.StatusPending || m.Attempts != 0 || m.Seq <= 0 || len(m.ID) != 26 {
			t.Fatalf("stored message: status %s attempts %d seq %d id %q; want PENDING, 0, a positive Seq, a ULID", m.Status, m.Attempts, m.Seq, m.ID)
		}
		if m.ClaimedBy != "" || !m.ClaimedAt.IsZero() || !m.SentAt.IsZero() || m.ProviderMessageID != "" || m.LastError != nil {
			t.Fatalf("a new message has lease, delivery or error fields set: %+v", m)
		}
		wantTime(t, "CreatedAt", m.CreatedAt, e.t0)
		wantTime(t, "NextAttemptAt", m.NextAttemptAt, e.t0)
		if res[0].Message.Seq != m.Seq || res[0].Message.ID != m.ID {
			t.Fatalf("EnqueueTx returned Seq %d ID %s; stored %d %s", res[0].Message.Seq, res[0].Message.ID, m.Seq, m.ID)
		}
	})

	t.Run("BatchStoresEveryField", func(t *testing.T) {
		// One call with several messages, where stores send columns
		// rather than rows: every field as given, and the defaults (tenant
		// "", key = ID, no headers, content type "") whether every message
		// of the call has them or only some.
		need(t, h, CapTenants, CapIdempotency)
		e := setup(t, h)
		mixed := []outbox.Message{
			{Topic: "a", Group: "g-1", Payload: json.RawMessage(`{"n":1}`)},
			{Tenant: "acme", Topic: "b", Group: "g-1", IdempotencyKey: "k-1", Payload: json.RawMessage(`{"n":2}`),
				Headers: map[string]string{"traceparent": "00-abc-def-01"}, MaxAttempts: 2, ContentType: "application/cloudevents+json"},
			{Tenant: "acme", Topic: "a", Payload: json.RawMessage(`{"n":3}`)},
		}
		defaults := []outbox.Message{
			{Topic: "a", Group: "g-2", Payload: json.RawMessage(`{"n":4}`)},
			{Topic: "a", Payload: json.RawMessage(`[5]`)},
		}
		for _, in := range [][]outbox.Message{mixed, defaults} {
			tx := e.begin()
			res, err := e.ob.EnqueueTx(e.ctx, tx, in...)
			require.NoError(t, err, "EnqueueTx")
			e.commit(tx)
			require.Len(t, res, len(in))
			for i, want := range in {
				m := e.get(want.Tenant, res[i].Message.ID)
				key := want.IdempotencyKey
				if key == "" {
					key = m.ID
				}
				if m.Tenant != want.Tenant || m.Topic != want.Topic || m.Group != want.Group || m.IdempotencyKey != key ||
					m.ContentType != want.ContentType || len(m.Headers) != len(want.Headers) || m.Headers["traceparent"] != want.Headers["traceparent"] ||
					m.Status != outbox.StatusPending || m.Seq != res[i].Message.Seq {
					t.Fatalf("message %d stored as %+v; want %+v", i, m, want)
				}
				if !jsonEqual(m.Payload, want.Payload) {
					t.Fatalf("message %d: payload %s, want %s", i, m.Payload, want.Payload)
				}
				if want.MaxAttempts != 0 && m.MaxAttempts != want.MaxAttempts {
					t.Fatalf("message %d: MaxAttempts %d, want %d", i, m.MaxAttempts, want.MaxAttempts)
				}
			}
		}
		// The keys hold: a repeat of the keyed message returns it.
		r, err := e.ob.Enqueue(e.ctx, outbox.Message{Tenant: "acme", Topic: "b", IdempotencyKey: "k-1", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err, "repeat")
		if !r[0].Existed || !jsonEqual(r[0].Message.Payload, mixed[1].Payload) {
			t.Fatalf("repeat of k-1: %+v; want the stored message", r[0])
		}
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		need(t, h, CapTransactions, CapIdempotency)
		e := setup(t, h)
		tx := e.begin()
		res, err := e.ob.EnqueueTx(e.ctx, tx, msg("t", "g", 1), msg("t", "", 2))
		require.NoError(t, err, "EnqueueTx")
		require.NoError(t, e.b.Rollback(e.ctx, tx), "Rollback")
		for _, r := range res {
			_, err := e.s.MessageGet(e.ctx, outbox.MessageGetParams{ID: r.Message.ID})
			wantErrIs(t, "MessageGet of a rolled-back message", err, outbox.ErrNotFound)
		}
		if got := e.claim("p", 10, e.at(time.Hour)); len(got) != 0 {
			t.Fatalf("claimed %d rolled-back messages", len(got))
		}
		wantCounts(t, e.count(""), nil)
		// The same idempotency key is free again.
		again := e.enqueue(outbox.Message{Topic: "t", IdempotencyKey: res[0].Message.IdempotencyKey, Payload: json.RawMessage(`1`)})
		if again[0].ID == res[0].Message.ID {
			t.Fatal("a rolled-back message came back")
		}
	})

	t.Run("OwnTransactionAssignsIncreasingSeq", func(t *testing.T) {
		e := setup(t, h)
		first := e.enqueueN("t", "g", 5)
		second := e.enqueueN("t", "g", 3)
		all := append(first, second...)
		for i := 1; i < len(all); i++ {
			if all[i].Seq <= all[i-1].Seq {
				t.Fatalf("Seq not increasing in enqueue order: %d then %d", all[i-1].Seq, all[i].Seq)
			}
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusPending: 8})
	})

	t.Run("DelayedFirstAttempt", func(t *testing.T) {
		need(t, h, CapCallerClock)
		e := setup(t, h)
		m := msg("t", "", 1)
		m.NextAttemptAt = e.at(time.Hour)
		got := e.enqueue(m)[0]
		wantTime(t, "NextAttemptAt", e.get("", got.ID).NextAttemptAt, e.at(time.Hour))
		if c := e.claim("p", 10, e.at(time.Minute)); len(c) != 0 {
			t.Fatalf("claimed a message delayed by an hour after a minute")
		}
		wantIDs(t, "claim after the delay", e.claim("p", 10, e.at(time.Hour)), got)
	})

	t.Run("IdempotentRepeatInCallerTx", func(t *testing.T) {
		need(t, h, CapIdempotency, CapTenants)
		e := setup(t, h)
		orig := e.enqueue(outbox.Message{Tenant: "a", Topic: "t", IdempotencyKey: "k", Payload: json.RawMessage(`{"v":1}`)})[0]

		tx := e.begin()
		res, err := e.ob.EnqueueTx(e.ctx, tx, outbox.Message{Tenant: "a", Topic: "t", IdempotencyKey: "k", Payload: json.RawMessage(`{"v":2}`)})
		require.NoError(t, err, "EnqueueTx of a repeated key")
		if len(res) != 1 || !res[0].Existed || res[0].Message.ID != orig.ID || !jsonEqual(res[0].Message.Payload, orig.Payload) {
			t.Fatalf("repeat: %+v, want the original %s with Existed", res, orig.ID)
		}
		e.usable(tx)
		// The transaction goes on: a new message, and a repeat within it.
		res, err = e.ob.EnqueueTx(e.ctx, tx,
			outbox.Message{Tenant: "a", Topic: "t", IdempotencyKey: "k2", Payload: json.RawMessage(`3`)},
			outbox.Message{Tenant: "a", Topic: "t", IdempotencyKey: "k2", Payload: json.RawMessage(`4`)},
			outbox.Message{Tenant: "b", Topic: "t", IdempotencyKey: "k", Payload: json.RawMessage(`5`)})
		require.NoError(t, err, "EnqueueTx after a repeat")
		if res[0].Existed || !res[1].Existed || res[1].Message.ID != res[0].Message.ID || res[2].Existed {
			t.Fatalf("repeat within one call: %+v; want new, existed (same ID), new (other tenant)", res)
		}
		e.usable(tx)
		e.commit(tx)
		wantCounts(t, e.count("a"), map[outbox.Status]int64{outbox.StatusPending: 2})
		wantCounts(t, e.count("b"), map[outbox.Status]int64{outbox.StatusPending: 1})
	})

	t.Run("IdempotentRepeatOwnTx", func(t *testing.T) {
		need(t, h, CapIdempotency, CapCallerIDs)
		e := setup(t, h)
		in := outbox.Message{Topic: "t", IdempotencyKey: "k", Payload: json.RawMessage(`1`)}
		orig := e.enqueue(in)[0]
		// The original moves on; a repeat still returns it as it is now.
		e.sent("p", e.t0, e.claim("p", 1, e.t0)...)
		res, err := e.ob.Enqueue(e.ctx, in)
		require.NoError(t, err, "Enqueue of a repeated key")
		if !res[0].Existed || res[0].Message.ID != orig.ID || res[0].Message.Status != outbox.StatusSent {
			t.Fatalf("repeat: %+v; want the original, SENT, with Existed", res[0])
		}
		// A caller-chosen ID repeated (the key defaults to the ID) is also a
		// repeat, not an error.
		withID := outbox.Message{ID: "01HZZZZZZZZZZZZZZZZZZZZZZZ", Topic: "t", Payload: json.RawMessage(`2`)}
		first := e.enqueue(withID)[0]
		res, err = e.ob.Enqueue(e.ctx, withID)
		if err != nil || !res[0].Existed || res[0].Message.ID != first.ID {
			t.Fatalf("repeat of a caller-chosen ID: %+v, %v; want Existed", res, err)
		}
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusSent: 1, outbox.StatusPending: 1})
	})

	t.Run("InvalidInputRejectedBeforeSQL", func(t *testing.T) {
		e := setup(t, h)
		bad := []outbox.Message{
			{Payload: json.RawMessage(`{}`)},                    // no topic
			{Topic: "t", Payload: json.RawMessage(`{not json`)}, // invalid payload
			{Topic: "t"}, // no payload
			{Topic: "t", Group: strings.Repeat("g", 300), Payload: json.RawMessage(`1`)}, // too long
			{Topic: "t", Tenant: "a\x00b", Payload: json.RawMessage(`1`)},                // control character
			{Topic: "t", MaxAttempts: -1, Payload: json.RawMessage(`1`)},
			{Topic: "t", Payload: []byte{0x0a, 0x00, 0xff}},                      // binary under the JSON default
			{Topic: "t", Payload: []byte("\"\xff\"")},                            // JSON, not UTF-8
			{Topic: "t", ContentType: "not a media type", Payload: []byte{0x0a}}, // bad content type
		}
		tx := e.begin()
		for i, m := range bad {
			_, err := e.ob.EnqueueTx(e.ctx, tx, m)
			wantErrIs(t, "Outbox.EnqueueTx of an invalid message", err, outbox.ErrInvalidInput)
			// The store itself validates too: it is safe to call directly.
			_, err = e.b.Enqueuer.MessageEnqueueTx(e.ctx, tx, outbox.MessageEnqueueParams{Messages: []outbox.Message{m}, Now: e.t0})
			wantErrIs(t, "Enqueuer.MessageEnqueueTx of an invalid message", err, outbox.ErrInvalidInput)
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("message %d: error %v is not a *outbox.ValidationError", i, err)
			}
			e.usable(tx)
		}
		// A batch with one bad message inserts nothing, even the good ones.
		_, err := e.b.Enqueuer.MessageEnqueueTx(e.ctx, tx, outbox.MessageEnqueueParams{
			Messages: []outbox.Message{msg("t", "", 1), bad[0]}, Now: e.t0,
		})
		wantErrIs(t, "a batch with an invalid message", err, outbox.ErrInvalidInput)
		e.usable(tx)
		good, err := e.ob.EnqueueTx(e.ctx, tx, msg("t", "", 2))
		require.NoError(t, err, "EnqueueTx after invalid input")
		e.commit(tx)
		page, err := e.s.MessageList(e.ctx, outbox.MessageListParams{})
		require.NoError(t, err)
		wantIDs(t, "messages after invalid input", page.Messages, good[0].Message)

		_, err = e.b.Enqueuer.MessageEnqueue(e.ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{msg("t", "", 3), bad[1]}, Now: e.t0})
		wantErrIs(t, "MessageEnqueue of a batch with an invalid message", err, outbox.ErrInvalidInput)
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusPending: 1})
	})

	t.Run("DirectCallFillsDefaults", func(t *testing.T) {
		need(t, h, CapIdempotency)
		e := setup(t, h)
		// Called without outbox.Outbox: no ID, no key, a stray status.
		res, err := e.b.Enqueuer.MessageEnqueue(e.ctx, outbox.MessageEnqueueParams{
			Messages: []outbox.Message{{Topic: "t", Payload: json.RawMessage(`1`), Status: outbox.StatusSent, Attempts: 4}},
			Now:      e.t0,
		})
		require.NoError(t, err, "MessageEnqueue")
		m := e.get("", res[0].Message.ID)
		if m.ID == "" || m.IdempotencyKey == "" || m.Status != outbox.StatusPending || m.Attempts != 0 {
			t.Fatalf("direct enqueue stored %+v; want an ID, a key, PENDING, 0 attempts", m)
		}
		wantTime(t, "CreatedAt", m.CreatedAt, e.t0)
		wantIDs(t, "claim", e.claim("p", 5, e.t0), m)
	})

	t.Run("CallerChosenIDClash", func(t *testing.T) {
		need(t, h, CapCallerIDs, CapIdempotency)
		e := setup(t, h)
		id := outbox.NewID(e.t0)
		e.enqueue(outbox.Message{ID: id, Topic: "t", IdempotencyKey: "a", Payload: json.RawMessage(`1`)})
		tx := e.begin()
		_, err := e.ob.EnqueueTx(e.ctx, tx, outbox.Message{ID: id, Topic: "t", IdempotencyKey: "b", Payload: json.RawMessage(`2`)})
		if err == nil {
			t.Fatal("a second message with the same ID and another key was accepted")
		}
		_ = e.b.Rollback(e.ctx, tx)
		wantCounts(t, e.count(""), map[outbox.Status]int64{outbox.StatusPending: 1})
	})
}
