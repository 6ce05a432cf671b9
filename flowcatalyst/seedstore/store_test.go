package seedstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/outbox"
)

var t0 = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

// dbNow is the database's clock, as the store writes processed_at.
func (b *bundle) dbNow(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	if err := b.dbQueryRow(b.q(`SELECT now() AT TIME ZONE 'UTC'`, nil)).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// near reports whether got is within a minute of want (the database's clock
// moves while a test runs).
func near(got, want time.Time) bool {
	d := got.Sub(want)
	return d > -time.Minute && d < time.Minute
}

// makeDue makes a PENDING row waiting for a retry due now.
func (b *bundle) makeDue(t *testing.T, topic, id string) {
	t.Helper()
	b.exec(t, `UPDATE `+b.table(topic)+` SET processed_at = now() AT TIME ZONE 'UTC' - interval '1 second' WHERE id = $1 AND status = 'PENDING'`, id)
}

func ids(msgs []outbox.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func claim(t *testing.T, st *seedstore.Store, limit int, now time.Time) []outbox.Message {
	t.Helper()
	msgs, err := st.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: limit, Owner: "p1", Now: now})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return msgs
}

func TestClaimMapsRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := b.insert(t, flowcatalyst.TopicEvent, "order-1", `{"type":"order.created"}`, t0)
	job := b.insert(t, flowcatalyst.TopicDispatchJob, "", `{"code":"x"}`, t0)
	now := t0.Add(time.Minute)
	msgs := claim(t, b.store, 10, now)
	if len(msgs) != 2 {
		t.Fatalf("claimed %d, want 2", len(msgs))
	}
	e, j := msgs[0], msgs[1]
	if e.ID != ev || e.Topic != flowcatalyst.TopicEvent || e.Group != "order-1" || string(e.Payload) != `{"type":"order.created"}` ||
		e.Status != outbox.StatusProcessing || e.Attempts != 1 || !e.CreatedAt.Equal(t0) || !near(e.ClaimedAt, b.dbNow(t)) || e.Seq == 0 {
		t.Errorf("event message %+v", e)
	}
	// A NULL message_group is the group "default", as in the seed.
	if j.ID != job || j.Topic != flowcatalyst.TopicDispatchJob || j.Group != "default" {
		t.Errorf("job message %+v", j)
	}
	r := b.row(t, flowcatalyst.TopicEvent, ev)
	// processed_at is the database's NOW(), and the message's ClaimedAt.
	if r.Status != "PROCESSING" || !r.ProcessedAt.Time.Equal(e.ClaimedAt) {
		t.Errorf("row after claim %+v", r)
	}
	if again := claim(t, b.store, 10, now); len(again) != 0 {
		t.Errorf("claimed %v twice", ids(again))
	}
}

func TestClaimKeepsFIFOPerGroup(t *testing.T) { t.Parallel(); testClaimKeepsFIFOPerGroup(t, setup) }

func testClaimKeepsFIFOPerGroup(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	a1 := b.insert(t, "EVENT", "A", `{}`, t0)
	a2 := b.insert(t, "EVENT", "A", `{}`, t0.Add(time.Second))
	a3 := b.insert(t, "EVENT", "A", `{}`, t0.Add(2*time.Second))
	b1 := b.insert(t, "EVENT", "B", `{}`, t0.Add(3*time.Second))
	u1 := b.insert(t, "EVENT", "", `{}`, t0.Add(4*time.Second))
	// Same group name in the other table is another group.
	j1 := b.insert(t, "DISPATCH_JOB", "A", `{}`, t0.Add(5*time.Second))
	now := t0.Add(time.Hour)

	// a1 is in flight (claimed by a seed processor, say): A is blocked.
	b.exec(t, `UPDATE `+b.table("EVENT")+` SET status = 'PROCESSING', processed_at = $2 WHERE id = $1`, a1, now)
	if got := ids(claim(t, b.store, 10, now)); !slices.Equal(got, []string{b1, u1, j1}) {
		t.Fatalf("claimed %v, want [b1 u1 j1] (group A blocked by its PROCESSING head)", got)
	}
	// a1 waits for a retry (PENDING, due later): A is still blocked.
	b.exec(t, `UPDATE `+b.table("EVENT")+` SET status = 'PENDING', processed_at = now() AT TIME ZONE 'UTC' + interval '1 minute' WHERE id = $1`, a1)
	if got := claim(t, b.store, 10, now); len(got) != 0 {
		t.Fatalf("claimed %v while group A's head waits for its retry", ids(got))
	}
	// Due: the whole group comes in order.
	b.makeDue(t, "EVENT", a1)
	if got := ids(claim(t, b.store, 10, now)); !slices.Equal(got, []string{a1, a2, a3}) {
		t.Fatalf("claimed %v, want [a1 a2 a3]", got)
	}
}

func TestFinishOutcomes(t *testing.T) { t.Parallel(); testFinishOutcomes(t, setup) }

func testFinishOutcomes(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	sent := b.insert(t, "EVENT", "", `{}`, t0)
	retry := b.insert(t, "EVENT", "R", `{}`, t0.Add(time.Second))
	retryNext := b.insert(t, "EVENT", "R", `{}`, t0.Add(2*time.Second))
	dead := b.insert(t, "DISPATCH_JOB", "", `{}`, t0.Add(3*time.Second))
	rel := b.insert(t, "DISPATCH_JOB", "", `{}`, t0.Add(4*time.Second))
	now := t0.Add(time.Hour)
	msgs := claim(t, b.store, 10, now)
	if len(msgs) != 5 {
		t.Fatalf("claimed %d", len(msgs))
	}
	next := now.Add(5 * time.Minute)
	res, err := b.store.MessageFinish(context.Background(), outbox.MessageFinishParams{
		Owner: "p1", Now: now.Add(time.Second),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: sent, Attempt: 1},
			{Kind: outbox.OutcomeRetry, ID: retry, Attempt: 1, NextAttemptAt: next, Error: &outbox.ErrorInfo{Code: "http_503", Message: "POST /api/events/batch: HTTP 503"}},
			{Kind: outbox.OutcomeDead, ID: dead, Attempt: 1, Error: &outbox.ErrorInfo{Code: "BAD_REQUEST", Message: "item BAD_REQUEST: no source"}},
			{Kind: outbox.OutcomeReleased, ID: rel, Attempt: 1}, {Kind: outbox.OutcomeReleased, ID: retryNext, Attempt: 1}},
	})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
	}
	check := func(topic, id, status string, retries int, processedAt time.Time, errMsg string) {
		t.Helper()
		r := b.row(t, topic, id)
		if r.Status != status || r.RetryCount != retries || r.Error.String != errMsg ||
			r.ProcessedAt.Valid != !processedAt.IsZero() || (r.ProcessedAt.Valid && !near(r.ProcessedAt.Time, processedAt)) {
			t.Errorf("row %s = %+v, want %s retries=%d processed_at=%s error=%q", id, r, status, retries, processedAt, errMsg)
		}
	}
	// processed_at is the database's NOW(); a retry is due after the
	// backoff (NextAttemptAt - Now) by the database's clock.
	db := b.dbNow(t)
	check("EVENT", sent, "COMPLETED", 0, db, "")
	check("EVENT", retry, "PENDING", 1, db.Add(next.Sub(now.Add(time.Second))), "http_503: POST /api/events/batch: HTTP 503")
	check("EVENT", retryNext, "PENDING", 0, time.Time{}, "")
	check("DISPATCH_JOB", dead, "FAILED", 0, db, "BAD_REQUEST: item BAD_REQUEST: no source")
	check("DISPATCH_JOB", rel, "PENDING", 0, time.Time{}, "")

	// The retry blocks its group until due; then it comes back as attempt 2
	// followed by the rest of the group.
	if got := ids(claim(t, b.store, 10, now.Add(time.Minute))); !slices.Equal(got, []string{rel}) {
		t.Fatalf("claimed %v before the retry was due, want only the released job", got)
	}
	b.makeDue(t, "EVENT", retry)
	got := claim(t, b.store, 10, next)
	if !slices.Equal(ids(got), []string{retry, retryNext}) || got[0].Attempts != 2 {
		t.Fatalf("claimed %v (attempts %d), want [retry retryNext] with attempt 2", ids(got), got[0].Attempts)
	}
	m, err := b.store.MessageGet(context.Background(), outbox.MessageGetParams{ID: dead})
	if err != nil || m.Status != outbox.StatusFailed || m.LastError == nil || m.LastError.Code != "BAD_REQUEST" || m.LastError.Message != "item BAD_REQUEST: no source" {
		t.Errorf("dead message %+v, %v", m, err)
	}
}

func TestFinishIsFencedByTheLease(t *testing.T) { t.Parallel(); testFinishIsFencedByTheLease(t, setup) }

func testFinishIsFencedByTheLease(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	id := b.insert(t, "EVENT", "", `{}`, t0)
	now := t0.Add(time.Hour)
	claim(t, b.store, 1, now)
	ctx := context.Background()
	// Another Store (another processor) cannot record an outcome for it.
	other := b.newStore(t)
	res, err := other.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p2", Now: now, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: id, Attempt: 1}}})
	if err != nil || !slices.Equal(res.LeaseLost, []string{id}) {
		t.Fatalf("finish by another store: %v, lost %v", err, res.LeaseLost)
	}
	// The lease expires, another processor recovers and claims it again.
	if b.mysql {
		// TIMESTAMP has whole seconds on MySQL: a lease expires, and the
		// reclaim's fence differs, a second later at the earliest.
		time.Sleep(1100 * time.Millisecond)
	}
	if _, err := other.MessageRecover(ctx, outbox.MessageRecoverParams{ClaimedBefore: now.Add(time.Minute), Now: now.Add(time.Minute), MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	reclaimed := claim(t, other, 1, now.Add(2*time.Minute))
	// As in the seed, recovery does not count an attempt.
	if len(reclaimed) != 1 || reclaimed[0].Attempts != 1 {
		t.Fatalf("reclaimed %+v", reclaimed)
	}
	// The first processor's late outcome is refused.
	res, err = b.store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p1", Now: now, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: id, Attempt: 1}}})
	if err != nil || !slices.Equal(res.LeaseLost, []string{id}) {
		t.Fatalf("late finish: %v, lost %v", err, res.LeaseLost)
	}
	if r := b.row(t, "EVENT", id); r.Status != "PROCESSING" {
		t.Fatalf("row %+v changed by a lost lease", r)
	}
	res, err = other.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p2", Now: now, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: id, Attempt: 1}}})
	if err != nil || len(res.LeaseLost) != 0 || b.row(t, "EVENT", id).Status != "COMPLETED" {
		t.Fatalf("finish by the lease holder: %v, lost %v", err, res.LeaseLost)
	}
}

func TestRecover(t *testing.T) {
	t.Parallel()
	for _, counts := range []bool{false, true} {
		t.Run(fmt.Sprint("RecoveryCountsAttempt=", counts), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			st, err := seedstore.New(b.db, seedstore.Options{EventsTable: b.opts.EventsTable, DispatchJobsTable: b.opts.DispatchJobsTable, RecoveryCountsAttempt: counts})
			if err != nil {
				t.Fatal(err)
			}
			stuck := b.insert(t, "EVENT", "G", `{}`, t0)
			last := b.insert(t, "DISPATCH_JOB", "", `{}`, t0)
			fresh := b.insert(t, "EVENT", "", `{}`, t0)
			// Stuck rows, as a crashed seed processor leaves them (by the
			// database's clock).
			set := `UPDATE %s SET status = 'PROCESSING', retry_count = $2, processed_at = now() AT TIME ZONE 'UTC' - $3::interval WHERE id = $1`
			b.exec(t, fmt.Sprintf(set, b.table("EVENT")), stuck, 0, "10 minutes")
			b.exec(t, fmt.Sprintf(set, b.table("DISPATCH_JOB")), last, 3, "10 minutes")
			b.exec(t, fmt.Sprintf(set, b.table("EVENT")), fresh, 0, "1 minute")
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
			r := b.row(t, "EVENT", stuck)
			if r.Status != "PENDING" || r.ProcessedAt.Valid || (r.RetryCount == 1) != counts {
				t.Errorf("stuck row %+v, want PENDING, processed_at NULL, retry_count counted: %v", r, counts)
			}
			r = b.row(t, "DISPATCH_JOB", last)
			if counts && (r.Status != "FAILED" || !strings.HasPrefix(r.Error.String, "lease_expired: ")) {
				t.Errorf("row on its last attempt %+v, want FAILED lease_expired", r)
			}
			if !counts && (r.Status != "PENDING" || r.RetryCount != 3) {
				t.Errorf("row on its last attempt %+v, want PENDING with retry_count 3 (no lost messages, just delayed)", r)
			}
			if r := b.row(t, "EVENT", fresh); r.Status != "PROCESSING" {
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
		all = append(all, b.insert(t, "EVENT", "G", `{}`, t0.Add(time.Duration(i)*time.Second)))
	}
	job := b.insert(t, "DISPATCH_JOB", "", `{}`, t0)
	all = append(all, job)
	b.exec(t, `UPDATE `+b.table("DISPATCH_JOB")+` SET status = 'FAILED', retry_count = 3, processed_at = $2, error_message = 'http_503: down' WHERE id = $1`, job, t0)

	counts, err := b.store.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || counts[outbox.StatusPending] != 5 || counts[outbox.StatusFailed] != 1 || len(counts) != len(outbox.Statuses()) {
		t.Errorf("counts %v, %v", counts, err)
	}
	page, err := b.store.MessageList(ctx, outbox.MessageListParams{Limit: 4})
	if err != nil || !slices.Equal(ids(page.Messages), all[:4]) || page.NextAfterSeq == 0 {
		t.Fatalf("page 1 %v next %d, %v", ids(page.Messages), page.NextAfterSeq, err)
	}
	page, err = b.store.MessageList(ctx, outbox.MessageListParams{Limit: 4, AfterSeq: page.NextAfterSeq})
	if err != nil || !slices.Equal(ids(page.Messages), all[4:]) || page.NextAfterSeq != 0 {
		t.Fatalf("page 2 %v next %d, %v", ids(page.Messages), page.NextAfterSeq, err)
	}
	page, _ = b.store.MessageList(ctx, outbox.MessageListParams{Status: outbox.StatusFailed, Topic: "DISPATCH_JOB"})
	if !slices.Equal(ids(page.Messages), []string{job}) {
		t.Errorf("failed jobs %v", ids(page.Messages))
	}
	if _, err := b.store.MessageGet(ctx, outbox.MessageGetParams{ID: "0000000000000"}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("get missing: %v", err)
	}
	if _, err := b.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: "other", ID: job}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("get in another tenant: %v", err)
	}
	if _, err := b.store.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: all[0]}); !errors.Is(err, outbox.ErrInvalidTransition) {
		t.Errorf("requeue PENDING: %v", err)
	}
	m, err := b.store.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: job})
	if err != nil || m.Status != outbox.StatusPending || m.Attempts != 0 || m.LastError != nil {
		t.Errorf("requeue: %+v, %v", m, err)
	}
	if _, err := b.store.MessageCancel(ctx, outbox.MessageCancelParams{ID: job}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("cancel: %v", err)
	}
	if _, err := b.store.MessageApplyReceipt(ctx, outbox.MessageApplyReceiptParams{}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("receipt: %v", err)
	}
	if a, err := b.store.AttemptList(ctx, outbox.AttemptListParams{MessageID: job}); err != nil || len(a) != 0 {
		t.Errorf("attempts: %v, %v", a, err)
	}
	b.exec(t, `UPDATE `+b.table("EVENT")+` SET status = 'COMPLETED', processed_at = $1`, t0)
	n, err := b.store.MessagePrune(ctx, outbox.MessagePruneParams{Before: t0.Add(time.Second), Limit: 3})
	if err != nil || n != 3 {
		t.Errorf("prune: %d, %v", n, err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, opts := range []seedstore.Options{
		{EventsTable: "bad name"},
		{EventsTable: `x"; DROP TABLE y; --`},
		{DispatchJobsTable: "a.b.c"},
		{EventsTable: "same", DispatchJobsTable: "same"},
	} {
		if _, err := seedstore.New(b.db, opts); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("New(%+v): %v, want ErrInvalidInput", opts, err)
		}
	}
	if _, err := seedstore.New(nil, seedstore.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := b.store.MessageClaim(context.Background(), outbox.MessageClaimParams{Limit: 0, Owner: "x"}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("claim limit 0: %v", err)
	}
}

func TestCreateTablesIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := seedstore.New(b.db, seedstore.Options{EventsTable: b.schema + ".ev2", DispatchJobsTable: b.schema + ".jobs2"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.CreateTables(context.Background()); err != nil {
			t.Fatalf("CreateTables: %v", err)
		}
	}
	b.exec(t, `INSERT INTO `+b.schema+`.ev2 (id, type, payload, status, created_at) VALUES ('0000000000001', 'EVENT', '{}', 'PENDING', now())`)
	if got := claim(t, st, 5, time.Now().Add(time.Hour)); len(got) != 1 {
		t.Fatalf("claimed %d from created tables", len(got))
	}
}

func TestInsertInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Insert(ctx, tx, seedstore.Item{Topic: "EVENT", Payload: []byte(`{"rolled":"back"}`)}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()

	tx, _ = b.db.BeginTx(ctx, nil)
	// Invalid items are refused before any statement: tx stays usable.
	for _, bad := range []seedstore.Item{
		{Topic: "whatsapp", Payload: []byte(`{}`)},
		{Topic: "EVENT", Payload: []byte(`not json`)},
		{Topic: "EVENT", Payload: []byte(`{}`), ID: "this-id-is-too-long"},
	} {
		if _, err := b.store.Insert(ctx, tx, bad); !errors.Is(err, outbox.ErrInvalidInput) {
			t.Errorf("Insert(%+v): %v, want ErrInvalidInput", bad, err)
		}
	}
	got, err := b.store.Insert(ctx, tx,
		seedstore.Item{Topic: "EVENT", Group: "o-1", Payload: []byte(`{"n":1}`)},
		seedstore.Item{Topic: "DISPATCH_JOB", Payload: []byte(`{"n":2}`)},
	)
	if err != nil || len(got) != 2 || len(got[0]) != 13 {
		t.Fatalf("Insert: %v, %v", got, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	claimed := claim(t, b.store, 10, time.Now().Add(time.Minute))
	if len(claimed) != 2 || claimed[0].ID != got[0] || claimed[0].Group != "o-1" || string(claimed[1].Payload) != `{"n":2}` {
		t.Fatalf("claimed %+v", claimed)
	}
}

func TestDeferredReleaseWaitsAndCountsNoRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	head := b.insert(t, "EVENT", "G", `{}`, t0)
	next := b.insert(t, "EVENT", "G", `{}`, t0.Add(time.Second))
	now := t0.Add(time.Hour)
	if got := claim(t, b.store, 10, now); len(got) != 2 {
		t.Fatalf("claimed %d", len(got))
	}
	due := now.Add(10 * time.Minute)
	res, err := b.store.MessageFinish(context.Background(), outbox.MessageFinishParams{Owner: "p1", Now: now,
		Outcomes: []outbox.Outcome{
			{Kind: outbox.OutcomeReleased, ID: head, Attempt: 1, NextAttemptAt: due, Error: &outbox.ErrorInfo{Code: "429", Message: "throttled"}},
			{Kind: outbox.OutcomeReleased, ID: next, Attempt: 1},
		}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
	}
	r := b.row(t, "EVENT", head)
	if wantDue := b.dbNow(t).Add(due.Sub(now)); r.Status != "PENDING" || r.RetryCount != 0 || !r.ProcessedAt.Valid || !near(r.ProcessedAt.Time, wantDue) {
		t.Fatalf("deferred row %+v, want PENDING, retry_count 0, due about %s", r, wantDue)
	}
	if got := claim(t, b.store, 10, now.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("claimed %v before the deferral ended (the group waits behind its head)", ids(got))
	}
	b.makeDue(t, "EVENT", head)
	if got := ids(claim(t, b.store, 10, due)); !slices.Equal(got, []string{head, next}) {
		t.Fatalf("claimed %v at the due time, want [head next]", got)
	}
}

// Rows of a group with the same created_at have no order (as in the seed):
// a claim that cuts through them must still make progress.
func TestClaimProgressesThroughEqualCreatedAt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := seedstore.New(b.db, seedstore.Options{EventsTable: b.opts.EventsTable, DispatchJobsTable: b.opts.DispatchJobsTable, MaxClaimPerGroup: 2})
	if err != nil {
		t.Fatal(err)
	}
	before := b.insert(t, "EVENT", "G", `{}`, t0.Add(-time.Second))
	for range 5 {
		b.insert(t, "EVENT", "G", `{}`, t0)
	}
	after := b.insert(t, "EVENT", "G", `{}`, t0.Add(time.Second))
	var order []string
	for range 10 {
		msgs := claim(t, st, 10, time.Now())
		if len(msgs) == 0 {
			break
		}
		var sent []outbox.Outcome
		for _, m := range msgs {
			order = append(order, m.ID)
			sent = append(sent, outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts})
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
	testReclaimBeforeForget(t, setup)
}

// testReclaimBeforeForget: a row a finish releases (due at once) is claimed
// again by the same Store between the finish's commit and the moment the
// finish forgets the lease it used. The new lease must survive: its outcome
// is written, not refused as a lost lease (which left the row PROCESSING
// until recovery: 131 rows in a CI run of the processor tier).
func testReclaimBeforeForget(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	ctx := context.Background()
	id := b.insert(t, flowcatalyst.TopicEvent, "g", `{"n":1}`, time.Now().Add(-time.Minute))
	first, err := b.store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
	if err != nil || len(first) != 1 || first[0].ID != id {
		t.Fatalf("claim: %d messages, %v", len(first), err)
	}
	var again []outbox.Message
	var againErr error
	seedstore.SetBeforeForget(b.store, func() {
		if again == nil && againErr == nil {
			again, againErr = b.store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
		}
	})
	res, err := b.store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeReleased, Topic: first[0].Topic, ID: id, Attempt: first[0].Attempts},
	}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("release: %+v, %v", res, err)
	}
	if againErr != nil || len(again) != 1 || again[0].ID != id {
		t.Fatalf("claim between commit and forget: %d messages, %v", len(again), againErr)
	}
	res, err = b.store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: again[0].Topic, ID: id, Attempt: again[0].Attempts},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.LeaseLost) != 0 {
		t.Fatalf("the outcome of the new claim was refused as a lost lease: %v", res.LeaseLost)
	}
	if got := b.row(t, flowcatalyst.TopicEvent, id); got.Status != seedstore.StatusCompleted {
		t.Fatalf("row is %s, want COMPLETED", got.Status)
	}
}
