package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
	"github.com/outboxkit/outboxkit/outbox"
)

func TestClaimMapsRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := b.Insert(t, flowcatalyst.TopicEvent, "order-1", `{"type":"order.created"}`, seedtest.T0)
	job := b.Insert(t, flowcatalyst.TopicDispatchJob, "", `{"code":"x"}`, seedtest.T0)
	now := seedtest.T0.Add(time.Minute)
	msgs := seedtest.Claim(t, b.Store, 10, now)
	if len(msgs) != 2 {
		t.Fatalf("claimed %d, want 2", len(msgs))
	}
	e, j := msgs[0], msgs[1]
	if e.ID != ev || e.Topic != flowcatalyst.TopicEvent || e.Group != "order-1" || string(e.Payload) != `{"type":"order.created"}` ||
		e.Status != outbox.StatusProcessing || e.Attempts != 1 || !e.CreatedAt.Equal(seedtest.T0) || !seedtest.Near(e.ClaimedAt, b.DBNow(t)) || e.Seq == 0 {
		t.Errorf("event message %+v", e)
	}
	// A NULL message_group is the group "default", as in the seed.
	if j.ID != job || j.Topic != flowcatalyst.TopicDispatchJob || j.Group != "default" {
		t.Errorf("job message %+v", j)
	}
	r := b.Row(t, flowcatalyst.TopicEvent, ev)
	// processed_at is the database's NOW(), and the message's ClaimedAt.
	if r.Status != "PROCESSING" || !r.ProcessedAt.Time.Equal(e.ClaimedAt) {
		t.Errorf("row after claim %+v", r)
	}
	if again := seedtest.Claim(t, b.Store, 10, now); len(again) != 0 {
		t.Errorf("claimed %v twice", seedtest.IDs(again))
	}
}

func TestClaimKeepsFIFOPerGroup(t *testing.T) {
	t.Parallel()
	seedtest.ClaimKeepsFIFOPerGroup(t, setup)
}

func TestFinishOutcomes(t *testing.T) { t.Parallel(); seedtest.FinishOutcomes(t, setup) }

func TestFinishIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	seedtest.FinishIsFencedByTheLease(t, setup)
}

func TestRecover(t *testing.T) {
	t.Parallel()
	for _, counts := range []bool{false, true} {
		t.Run(fmt.Sprint("RecoveryCountsAttempt=", counts), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			st, err := postgres.New(b.DB, postgres.Options{EventsTable: optionsOf(b).EventsTable, DispatchJobsTable: optionsOf(b).DispatchJobsTable, RecoveryCountsAttempt: counts})
			if err != nil {
				t.Fatal(err)
			}
			stuck := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0)
			last := b.Insert(t, "DISPATCH_JOB", "", `{}`, seedtest.T0)
			fresh := b.Insert(t, "EVENT", "", `{}`, seedtest.T0)
			// Stuck rows, as a crashed seed processor leaves them (by the
			// database's clock).
			set := `UPDATE %s SET status = 'PROCESSING', retry_count = $2, processed_at = now() AT TIME ZONE 'UTC' - $3::interval WHERE id = $1`
			b.Exec(t, fmt.Sprintf(set, b.Table("EVENT")), stuck, 0, "10 minutes")
			b.Exec(t, fmt.Sprintf(set, b.Table("DISPATCH_JOB")), last, 3, "10 minutes")
			b.Exec(t, fmt.Sprintf(set, b.Table("EVENT")), fresh, 0, "1 minute")
			// The caller's clock is far off: only the timeout (Now -
			// ClaimedBefore) matters.
			now := time.Now().Add(24 * time.Hour)
			res, err := st.MessageRecover(context.Background(), outbox.MessageRecoverParams{ClaimedBefore: now.Add(-5 * time.Minute), Now: now, MaxAttempts: 4})
			want := outbox.RecoverResult{Recovered: 2}
			if counts {
				want = outbox.RecoverResult{Recovered: 1, DeadLettered: 1}
			}
			if err != nil || res != want {
				t.Fatalf("recover: %+v, %v, want %+v", res, err, want)
			}
			r := b.Row(t, "EVENT", stuck)
			if r.Status != "PENDING" || r.ProcessedAt.Valid || (r.RetryCount == 1) != counts {
				t.Errorf("stuck row %+v, want PENDING, processed_at NULL, retry_count counted: %v", r, counts)
			}
			r = b.Row(t, "DISPATCH_JOB", last)
			if counts && (r.Status != "FAILED" || !strings.HasPrefix(r.Error.String, "lease_expired: ")) {
				t.Errorf("row on its last attempt %+v, want FAILED lease_expired", r)
			}
			if !counts && (r.Status != "PENDING" || r.RetryCount != 3) {
				t.Errorf("row on its last attempt %+v, want PENDING with retry_count 3 (no lost messages, just delayed)", r)
			}
			if r := b.Row(t, "EVENT", fresh); r.Status != "PROCESSING" {
				t.Errorf("row within its lease %+v was recovered", r)
			}
			if _, err := st.MessageRecover(context.Background(), outbox.MessageRecoverParams{ClaimedBefore: now}); !errors.Is(err, outbox.ErrInvalidInput) {
				t.Errorf("MaxAttempts 0: %v, want ErrInvalidInput", err)
			}
		})
	}
}

func TestQueries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var all []string
	for i := range 5 {
		all = append(all, b.Insert(t, "EVENT", "G", `{}`, seedtest.T0.Add(time.Duration(i)*time.Second)))
	}
	job := b.Insert(t, "DISPATCH_JOB", "", `{}`, seedtest.T0)
	all = append(all, job)
	b.Exec(t, `UPDATE `+b.Table("DISPATCH_JOB")+` SET status = 'FAILED', retry_count = 3, processed_at = $2, error_message = 'http_503: down' WHERE id = $1`, job, seedtest.T0)

	counts, err := b.Store.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || counts[outbox.StatusPending] != 5 || counts[outbox.StatusFailed] != 1 || len(counts) != len(outbox.Statuses()) {
		t.Errorf("counts %v, %v", counts, err)
	}
	page, err := b.Store.MessageList(ctx, outbox.MessageListParams{Limit: 4})
	if err != nil || !slices.Equal(seedtest.IDs(page.Messages), all[:4]) || page.NextAfterSeq == 0 {
		t.Fatalf("page 1 %v next %d, %v", seedtest.IDs(page.Messages), page.NextAfterSeq, err)
	}
	page, err = b.Store.MessageList(ctx, outbox.MessageListParams{Limit: 4, AfterSeq: page.NextAfterSeq})
	if err != nil || !slices.Equal(seedtest.IDs(page.Messages), all[4:]) || page.NextAfterSeq != 0 {
		t.Fatalf("page 2 %v next %d, %v", seedtest.IDs(page.Messages), page.NextAfterSeq, err)
	}
	page, _ = b.Store.MessageList(ctx, outbox.MessageListParams{Status: outbox.StatusFailed, Topic: "DISPATCH_JOB"})
	if !slices.Equal(seedtest.IDs(page.Messages), []string{job}) {
		t.Errorf("failed jobs %v", seedtest.IDs(page.Messages))
	}
	if _, err := b.Store.MessageGet(ctx, outbox.MessageGetParams{ID: "0000000000000"}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("get missing: %v", err)
	}
	if _, err := b.Store.MessageGet(ctx, outbox.MessageGetParams{Tenant: "other", ID: job}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("get in another tenant: %v", err)
	}
	if _, err := b.Store.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: all[0]}); !errors.Is(err, outbox.ErrInvalidTransition) {
		t.Errorf("requeue PENDING: %v", err)
	}
	m, err := b.Store.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: job})
	if err != nil || m.Status != outbox.StatusPending || m.Attempts != 0 || m.LastError != nil {
		t.Errorf("requeue: %+v, %v", m, err)
	}
	if _, err := b.Store.MessageCancel(ctx, outbox.MessageCancelParams{ID: job}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("cancel: %v", err)
	}
	if _, err := b.Store.MessageApplyReceipt(ctx, outbox.MessageApplyReceiptParams{}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("receipt: %v", err)
	}
	if a, err := b.Store.AttemptList(ctx, outbox.AttemptListParams{MessageID: job}); err != nil || len(a) != 0 {
		t.Errorf("attempts: %v, %v", a, err)
	}
	b.Exec(t, `UPDATE `+b.Table("EVENT")+` SET status = 'COMPLETED', processed_at = $1`, seedtest.T0)
	n, err := b.Store.MessagePrune(ctx, outbox.MessagePruneParams{Before: seedtest.T0.Add(time.Second), Limit: 3})
	if err != nil || n != 3 {
		t.Errorf("prune: %d, %v", n, err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, opts := range []postgres.Options{
		{EventsTable: "bad name"},
		{EventsTable: `x"; DROP TABLE y; --`},
		{DispatchJobsTable: "a.b.c"},
		{EventsTable: "same", DispatchJobsTable: "same"},
	} {
		if _, err := postgres.New(b.DB, opts); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("New(%+v): %v, want ErrInvalidInput", opts, err)
		}
	}
	if _, err := postgres.New(nil, postgres.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := b.Store.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 0, Owner: "x"}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("claim limit 0: %v", err)
	}
}

func TestCreateTablesIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := postgres.New(b.DB, postgres.Options{EventsTable: b.Schema + ".ev2", DispatchJobsTable: b.Schema + ".jobs2"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.CreateTables(context.Background()); err != nil {
			t.Fatalf("CreateTables: %v", err)
		}
	}
	b.Exec(t, `INSERT INTO `+b.Schema+`.ev2 (id, type, payload, status, created_at) VALUES ('0000000000001', 'EVENT', '{}', 'PENDING', now())`)
	if got := seedtest.Claim(t, st, 5, time.Now().Add(time.Hour)); len(got) != 1 {
		t.Fatalf("claimed %d from created tables", len(got))
	}
}

func TestInsertInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Store.(*postgres.Store).Insert(ctx, tx, postgres.Item{Topic: "EVENT", Payload: []byte(`{"rolled":"back"}`)}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()

	tx, _ = b.DB.BeginTx(ctx, nil)
	// Invalid items are refused before any statement: tx stays usable.
	for _, bad := range []postgres.Item{
		{Topic: "whatsapp", Payload: []byte(`{}`)},
		{Topic: "EVENT", Payload: []byte(`not json`)},
		{Topic: "EVENT", Payload: []byte(`{}`), ID: "this-id-is-too-long"},
	} {
		if _, err := b.Store.(*postgres.Store).Insert(ctx, tx, bad); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("Insert(%+v): %v, want ErrInvalidInput", bad, err)
		}
	}
	got, err := b.Store.(*postgres.Store).Insert(ctx, tx,
		postgres.Item{Topic: "EVENT", Group: "o-1", Payload: []byte(`{"n":1}`)},
		postgres.Item{Topic: "DISPATCH_JOB", Payload: []byte(`{"n":2}`)},
	)
	if err != nil || len(got) != 2 || len(got[0]) != 13 {
		t.Fatalf("Insert: %v, %v", got, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	claimed := seedtest.Claim(t, b.Store, 10, time.Now().Add(time.Minute))
	if len(claimed) != 2 || claimed[0].ID != got[0] || claimed[0].Group != "o-1" || string(claimed[1].Payload) != `{"n":2}` {
		t.Fatalf("claimed %+v", claimed)
	}
}

func TestDeferredReleaseWaitsAndCountsNoRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	head := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0)
	next := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0.Add(time.Second))
	now := seedtest.T0.Add(time.Hour)
	got := seedtest.Claim(t, b.Store, 10, now)
	if len(got) != 2 {
		t.Fatalf("claimed %d", len(got))
	}
	due := now.Add(10 * time.Minute)
	res, err := b.Store.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Now: now,
		Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeReleased, ID: head, Attempt: 1, ClaimToken: got[0].ClaimToken, NextAttemptAt: due, Error: &outbox.ErrorInfo{Code: "429", Message: "throttled"}},
			{Kind: outbox.OutcomeReleased, ID: next, Attempt: 1, ClaimToken: got[1].ClaimToken},
		}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
	}
	r := b.Row(t, "EVENT", head)
	if wantDue := b.DBNow(t).Add(due.Sub(now)); r.Status != "PENDING" || r.RetryCount != 0 || !r.ProcessedAt.Valid || !seedtest.Near(r.ProcessedAt.Time, wantDue) {
		t.Fatalf("deferred row %+v, want PENDING, retry_count 0, due about %s", r, wantDue)
	}
	if got := seedtest.Claim(t, b.Store, 10, now.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("claimed %v before the deferral ended (the group waits behind its head)", seedtest.IDs(got))
	}
	b.MakeDue(t, "EVENT", head)
	if got := seedtest.IDs(seedtest.Claim(t, b.Store, 10, due)); !slices.Equal(got, []string{head, next}) {
		t.Fatalf("claimed %v at the due time, want [head next]", got)
	}
}

// Rows of a group with the same created_at have no order (as in the seed):
// a claim that cuts through them must still make progress.
func TestClaimProgressesThroughEqualCreatedAt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := postgres.New(b.DB, postgres.Options{EventsTable: optionsOf(b).EventsTable, DispatchJobsTable: optionsOf(b).DispatchJobsTable, MaxClaimPerGroup: 2})
	if err != nil {
		t.Fatal(err)
	}
	before := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0.Add(-time.Second))
	for range 5 {
		b.Insert(t, "EVENT", "G", `{}`, seedtest.T0)
	}
	after := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0.Add(time.Second))
	var order []string
	for range 10 {
		msgs := seedtest.Claim(t, st, 10, time.Now())
		if len(msgs) == 0 {
			break
		}
		var sent []outbox.Outcome
		for _, m := range msgs {
			order = append(order, m.ID)
			sent = append(sent, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		if res, err := st.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Outcomes: sent}); err != nil || len(res.LeaseLost) > 0 {
			t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
		}
	}
	if len(order) != 7 || order[0] != before || order[6] != after {
		t.Fatalf("claimed %v, want all 7 rows, %s first and %s last", order, before, after)
	}
}

func TestReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	seedtest.ReclaimBeforeForget(t, setup)
}

// One MessageFinish call may carry the outcomes of an event and a dispatch
// job with the same id: each applies to its own table.
func TestFinishTakesSharedIDsInOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO `+b.Table("EVENT")+` (id, type, payload, status, created_at) VALUES ('S1', 'EVENT', '{}', 'PENDING', $1)`, seedtest.T0)
	b.Exec(t, `INSERT INTO `+b.Table("DISPATCH_JOB")+` (id, type, payload, status, created_at) VALUES ('S1', 'DISPATCH_JOB', '{}', 'PENDING', $1)`, seedtest.T0)
	got := seedtest.Claim(t, b.Store, 10, seedtest.T0)
	if len(got) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(got))
	}
	p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
	for _, m := range got {
		o := outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken}
		if m.Topic == flowcatalyst.TopicDispatchJob {
			o.Kind, o.Error = outbox.OutcomeDead, &outbox.ErrorInfo{Code: "400", Message: "bad"}
		}
		p.Outcomes = append(p.Outcomes, o)
	}
	res, err := b.Store.MessageFinish(context.Background(), p)
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("MessageFinish: %+v, %v", res, err)
	}
	if ev, job := b.Row(t, "EVENT", "S1"), b.Row(t, "DISPATCH_JOB", "S1"); ev.Status != "COMPLETED" || job.Status != "FAILED" {
		t.Errorf("event %s, job %s; want COMPLETED and FAILED", ev.Status, job.Status)
	}
	// Two outcomes for one row are still refused.
	p = outbox.MessageFinishParams{Owner: "p", Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: "EVENT", ID: "S1", Attempt: 1}, {Kind: outbox.OutcomeSent, Topic: "EVENT", ID: "S1", Attempt: 1},
	}}
	if _, err := b.Store.MessageFinish(context.Background(), p); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("two outcomes for one row: %v", err)
	}
}

func TestIDsSharedAcrossTablesKeepTheirOwnOutcome(t *testing.T) {
	t.Parallel()
	seedtest.IDsSharedAcrossTablesKeepTheirOwnOutcome(t, setup)
}
