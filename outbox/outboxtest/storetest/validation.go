package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outboxkit/outbox"
)

// testValidation: a store refuses bad input to every write operation with
// the core's typed error (a *outbox.ValidationError matching
// outbox.ErrInvalidInput) before it writes anything, so a call with one bad
// part among good ones changes nothing.
func testValidation[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("RefusedBeforeWrite", func(t *testing.T) {
		e := setup(t, h)
		// The world each bad call must leave as it is: one SENT message (with
		// a provider message ID), two PROCESSING, one PENDING.
		ms := e.enqueueN("t", "", 4)
		c := e.claim("p", 3, e.t0)
		if len(c) != 3 {
			t.Fatalf("claimed %d, want 3", len(c))
		}
		e.finish(outbox.MessageFinishParams{Owner: "p", Now: e.t0, Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeSent, Topic: "t", ID: c[0].ID, Attempt: 1, ClaimToken: c[0].ClaimToken, ProviderMessageID: "prov-1"},
		}})
		before := e.snapshot(ms)
		later := e.at(time.Hour)
		sent := outbox.Outcome{Kind: outbox.OutcomeSent, Topic: "t", ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken}
		bad := outbox.Message{Topic: "t", Payload: []byte(`{not json`)}

		refused := func(op string, err error) {
			t.Helper()
			var ve *outbox.ValidationError
			if !errors.Is(err, outbox.ErrInvalidInput) || !errors.As(err, &ve) {
				t.Fatalf("%s: %v; want a *outbox.ValidationError matching outbox.ErrInvalidInput", op, err)
			}
			if got := e.snapshot(ms); !reflect.DeepEqual(got, before) {
				t.Fatalf("%s was refused but wrote:\n got  %v\n want %v", op, got, before)
			}
		}

		_, err := e.b.Enqueuer.MessageEnqueue(e.ctx, outbox.MessageEnqueueParams{Messages: []outbox.Message{msg("t", "", 9), bad}, Now: e.t0})
		refused("MessageEnqueue of a good and a bad message", err)
		tx := e.begin()
		_, err = e.b.Enqueuer.MessageEnqueueTx(e.ctx, tx, outbox.MessageEnqueueParams{Messages: []outbox.Message{msg("t", "", 9), bad}, Now: e.t0})
		e.commit(tx)
		refused("MessageEnqueueTx of a good and a bad message, committed", err)

		for name, p := range map[string]outbox.MessageClaimParams{
			"Limit 0":        {Owner: "q", Now: later},
			"no Owner":       {Limit: 10, Now: later},
			"an empty topic": {Limit: 10, Owner: "q", Topics: []string{"t", ""}, Now: later},
		} {
			_, err := e.s.MessageClaim(e.ctx, p)
			refused("MessageClaim with "+name, err)
		}

		for name, p := range map[string]outbox.MessageFinishParams{
			"no Owner":                    {Now: later, Outcomes: []outbox.Outcome{sent}},
			"a dead letter with no Error": {Owner: "p", Now: later, Outcomes: []outbox.Outcome{sent, {Kind: outbox.OutcomeDead, Topic: "t", ID: c[2].ID, Attempt: 1, ClaimToken: c[2].ClaimToken}}},
			"one message twice":           {Owner: "p", Now: later, Outcomes: []outbox.Outcome{sent, sent}},
		} {
			_, err := e.s.MessageFinish(e.ctx, p)
			refused("MessageFinish with "+name, err)
		}

		for name, p := range map[string]outbox.MessageRecoverParams{
			"no ClaimedBefore": {Now: later},
			"MaxRecoveries -1": {ClaimedBefore: later, Now: later, MaxRecoveries: -1},
			"MaxAttempts -1":   {ClaimedBefore: later, Now: later, MaxAttempts: -1},
		} {
			_, err := e.s.MessageRecover(e.ctx, p)
			refused("MessageRecover with "+name, err)
		}

		if !h.lacks(CapCancel) {
			_, err = e.s.MessageCancel(e.ctx, outbox.MessageCancelParams{Now: later})
			refused("MessageCancel with no ID", err)
		}
		_, err = e.s.MessageRequeue(e.ctx, outbox.MessageRequeueParams{Now: later})
		refused("MessageRequeue with no ID", err)

		for name, p := range map[string]outbox.MessagePruneParams{
			"no Before":        {Statuses: []outbox.Status{outbox.StatusSent}},
			"Limit -1":         {Before: later, Limit: -1},
			"a PENDING status": {Before: later, Statuses: []outbox.Status{outbox.StatusSent, outbox.StatusPending}},
			"a too long Topic": {Before: later, Topic: strings.Repeat("t", outbox.MaxKeyLength+1)},
		} {
			_, err := e.s.MessagePrune(e.ctx, p)
			refused("MessagePrune with "+name, err)
		}

		if !h.lacks(CapReceipts) {
			for name, r := range map[string]outbox.Receipt{
				"no ProviderMessageID": {Status: outbox.DeliveryDelivered, At: later},
				"an unknown status":    {ProviderMessageID: "prov-1", Status: "arrived", At: later},
			} {
				_, err := e.s.MessageApplyReceipt(e.ctx, outbox.MessageApplyReceiptParams{Receipt: r})
				refused("MessageApplyReceipt with "+name, err)
			}
		}
		if !h.lacks(CapLeaseExtend) {
			_, err := e.extender().MessageExtendLease(e.ctx, outbox.MessageExtendLeaseParams{Owner: "p", Now: later, Leases: []outbox.Lease{
				{Topic: "t", ID: c[1].ID, Attempt: 1, ClaimToken: c[1].ClaimToken}, {Topic: "t", ID: c[2].ID},
			}})
			refused("MessageExtendLease with a good and a bad lease", err)
		}
	})
}

// snapshot describes everything a write could change in the store's tenant
// "": its messages (those of ms by ID, and how many there are in all) and
// its counts by status.
func (e *env[TTx]) snapshot(ms []outbox.Message) []string {
	e.t.Helper()
	page, err := e.s.MessageList(e.ctx, outbox.MessageListParams{Limit: 100})
	require.NoError(e.t, err, "MessageList")
	out := []string{fmt.Sprintf("%d messages, counts %v", len(page.Messages), e.count(""))}
	for _, m := range ms {
		g := e.get("", m.ID)
		out = append(out, fmt.Sprintf("%s %s attempts=%d owner=%q token=%q provider=%q next=%s claimed=%s updated=%s delivered=%s",
			g.ID, g.Status, g.Attempts, g.ClaimedBy, g.ClaimToken, g.ProviderMessageID, stamp(g.NextAttemptAt), stamp(g.ClaimedAt), stamp(g.UpdatedAt), stamp(g.DeliveredAt)))
	}
	return out
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
