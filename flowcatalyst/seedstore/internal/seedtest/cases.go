package seedtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
	"github.com/outboxkit/outboxkit/outbox"
)

// ClaimKeepsFIFOPerGroup: a group whose head is in flight or waits for a
// retry is not claimed; once due, the whole group comes in order.
func ClaimKeepsFIFOPerGroup(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	a1 := b.Insert(t, "EVENT", "A", `{}`, T0)
	a2 := b.Insert(t, "EVENT", "A", `{}`, T0.Add(time.Second))
	a3 := b.Insert(t, "EVENT", "A", `{}`, T0.Add(2*time.Second))
	b1 := b.Insert(t, "EVENT", "B", `{}`, T0.Add(3*time.Second))
	u1 := b.Insert(t, "EVENT", "", `{}`, T0.Add(4*time.Second))
	// Same group name in the other table is another group.
	j1 := b.Insert(t, "DISPATCH_JOB", "A", `{}`, T0.Add(5*time.Second))
	now := T0.Add(time.Hour)

	// a1 is in flight (claimed by a seed processor, say): A is blocked.
	b.Exec(t, `UPDATE `+b.Table("EVENT")+` SET status = 'PROCESSING', processed_at = $2 WHERE id = $1`, a1, now)
	if got := IDs(Claim(t, b.Store, 10, now)); !slices.Equal(got, []string{b1, u1, j1}) {
		t.Fatalf("claimed %v, want [b1 u1 j1] (group A blocked by its PROCESSING head)", got)
	}
	// a1 waits for a retry (PENDING, due later): A is still blocked.
	b.Exec(t, `UPDATE `+b.Table("EVENT")+` SET status = 'PENDING', processed_at = now() AT TIME ZONE 'UTC' + interval '1 minute' WHERE id = $1`, a1)
	if got := Claim(t, b.Store, 10, now); len(got) != 0 {
		t.Fatalf("claimed %v while group A's head waits for its retry", IDs(got))
	}
	// Due: the whole group comes in order.
	b.MakeDue(t, "EVENT", a1)
	if got := IDs(Claim(t, b.Store, 10, now)); !slices.Equal(got, []string{a1, a2, a3}) {
		t.Fatalf("claimed %v, want [a1 a2 a3]", got)
	}
}

// FinishOutcomes: each kind of outcome writes the row as the seed does, on
// the database's clock.
func FinishOutcomes(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	sent := b.Insert(t, "EVENT", "", `{}`, T0)
	retry := b.Insert(t, "EVENT", "R", `{}`, T0.Add(time.Second))
	retryNext := b.Insert(t, "EVENT", "R", `{}`, T0.Add(2*time.Second))
	dead := b.Insert(t, "DISPATCH_JOB", "", `{}`, T0.Add(3*time.Second))
	rel := b.Insert(t, "DISPATCH_JOB", "", `{}`, T0.Add(4*time.Second))
	now := T0.Add(time.Hour)
	msgs := Claim(t, b.Store, 10, now)
	if len(msgs) != 5 {
		t.Fatalf("claimed %d", len(msgs))
	}
	next := now.Add(5 * time.Minute)
	tok := map[string]string{}
	for _, m := range msgs {
		tok[m.ID] = m.ClaimToken
	}
	res, err := b.Store.MessageFinish(context.Background(), outbox.MessageFinishParams{
		Owner: "p1", Now: now.Add(time.Second),
		Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: sent, Attempt: 1, ClaimToken: tok[sent]},
			{Kind: outbox.OutcomeRetry, ID: retry, Attempt: 1, ClaimToken: tok[retry], NextAttemptAt: next, Error: &outbox.ErrorInfo{Code: "http_503", Message: "POST /api/events/batch: HTTP 503"}},
			{Kind: outbox.OutcomeDead, ID: dead, Attempt: 1, ClaimToken: tok[dead], Error: &outbox.ErrorInfo{Code: "BAD_REQUEST", Message: "item BAD_REQUEST: no source"}},
			{Kind: outbox.OutcomeReleased, ID: rel, Attempt: 1, ClaimToken: tok[rel]}, {Kind: outbox.OutcomeReleased, ID: retryNext, Attempt: 1, ClaimToken: tok[retryNext]}},
	})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("finish: %v, lost %v", err, res.LeaseLost)
	}
	check := func(topic, id, status string, retries int, processedAt time.Time, errMsg string) {
		t.Helper()
		r := b.Row(t, topic, id)
		if r.Status != status || r.RetryCount != retries || r.Error.String != errMsg ||
			r.ProcessedAt.Valid != !processedAt.IsZero() || (r.ProcessedAt.Valid && !Near(r.ProcessedAt.Time, processedAt)) {
			t.Errorf("row %s = %+v, want %s retries=%d processed_at=%s error=%q", id, r, status, retries, processedAt, errMsg)
		}
	}
	// processed_at is the database's NOW(); a retry is due after the
	// backoff (NextAttemptAt - Now) by the database's clock.
	db := b.DBNow(t)
	check("EVENT", sent, "COMPLETED", 0, db, "")
	check("EVENT", retry, "PENDING", 1, db.Add(next.Sub(now.Add(time.Second))), "http_503: POST /api/events/batch: HTTP 503")
	check("EVENT", retryNext, "PENDING", 0, time.Time{}, "")
	check("DISPATCH_JOB", dead, "FAILED", 0, db, "BAD_REQUEST: item BAD_REQUEST: no source")
	check("DISPATCH_JOB", rel, "PENDING", 0, time.Time{}, "")

	// The retry blocks its group until due; then it comes back as attempt 2
	// followed by the rest of the group.
	if got := IDs(Claim(t, b.Store, 10, now.Add(time.Minute))); !slices.Equal(got, []string{rel}) {
		t.Fatalf("claimed %v before the retry was due, want only the released job", got)
	}
	b.MakeDue(t, "EVENT", retry)
	got := Claim(t, b.Store, 10, next)
	if !slices.Equal(IDs(got), []string{retry, retryNext}) || got[0].Attempts != 2 {
		t.Fatalf("claimed %v (attempts %d), want [retry retryNext] with attempt 2", IDs(got), got[0].Attempts)
	}
	m, err := b.Store.MessageGet(context.Background(), outbox.MessageGetParams{ID: dead})
	if err != nil || m.Status != outbox.StatusFailed || m.LastError == nil || m.LastError.Code != "BAD_REQUEST" || m.LastError.Message != "item BAD_REQUEST: no source" {
		t.Errorf("dead message %+v, %v", m, err)
	}
}

// FinishIsFencedByTheLease: an outcome applies only through the Store that
// holds the lease.
func FinishIsFencedByTheLease(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	id := b.Insert(t, "EVENT", "", `{}`, T0)
	now := T0.Add(time.Hour)
	first := Claim(t, b.Store, 1, now)
	ctx := context.Background()
	// Another Store (another processor) cannot record an outcome for it.
	other := b.New(t)
	res, err := other.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p2", Now: now, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: id, Attempt: 1, ClaimToken: first[0].ClaimToken}}})
	if err != nil || !slices.Equal(res.LeaseLost, []string{id}) {
		t.Fatalf("finish by another store: %v, lost %v", err, res.LeaseLost)
	}
	// The lease expires, another processor recovers and claims it again.
	if b.MySQL {
		// TIMESTAMP has whole seconds on MySQL: a lease expires, and the
		// reclaim's fence differs, a second later at the earliest.
		time.Sleep(1100 * time.Millisecond)
	}
	if _, err := other.MessageRecover(ctx, outbox.MessageRecoverParams{ClaimedBefore: now.Add(time.Minute), Now: now.Add(time.Minute), MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	reclaimed := Claim(t, other, 1, now.Add(2*time.Minute))
	// As in the seed, recovery does not count an attempt.
	if len(reclaimed) != 1 || reclaimed[0].Attempts != 1 {
		t.Fatalf("reclaimed %+v", reclaimed)
	}
	// The first processor's late outcome is refused.
	res, err = b.Store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p1", Now: now, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: id, Attempt: 1, ClaimToken: first[0].ClaimToken}}})
	if err != nil || !slices.Equal(res.LeaseLost, []string{id}) {
		t.Fatalf("late finish: %v, lost %v", err, res.LeaseLost)
	}
	if r := b.Row(t, "EVENT", id); r.Status != "PROCESSING" {
		t.Fatalf("row %+v changed by a lost lease", r)
	}
	res, err = other.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p2", Now: now, Outcomes: []outbox.Outcome{{Kind: outbox.OutcomeSent, ID: id, Attempt: 1, ClaimToken: reclaimed[0].ClaimToken}}})
	if err != nil || len(res.LeaseLost) != 0 || b.Row(t, "EVENT", id).Status != "COMPLETED" {
		t.Fatalf("finish by the lease holder: %v, lost %v", err, res.LeaseLost)
	}
}

// ReclaimBeforeForget: a row a finish releases (due at once) is claimed
// again by the same Store between the finish's commit and the moment the
// finish forgets the lease it used. The new lease must survive: its outcome
// is written, not refused as a lost lease (which left the row PROCESSING
// until recovery: 131 rows in a CI run of the processor tier).
func ReclaimBeforeForget(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	ctx := context.Background()
	id := b.Insert(t, flowcatalyst.TopicEvent, "g", `{"n":1}`, time.Now().Add(-time.Minute))
	first, err := b.Store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
	if err != nil || len(first) != 1 || first[0].ID != id {
		t.Fatalf("claim: %d messages, %v", len(first), err)
	}
	var again []outbox.Message
	var againErr error
	b.SetBeforeForget(b.Store, func() {
		if again == nil && againErr == nil {
			again, againErr = b.Store.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 10, Owner: "p", Now: time.Now()})
		}
	})
	res, err := b.Store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeReleased, Topic: first[0].Topic, ID: id, Attempt: first[0].Attempts, ClaimToken: first[0].ClaimToken},
	}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("release: %+v, %v", res, err)
	}
	if againErr != nil || len(again) != 1 || again[0].ID != id {
		t.Fatalf("claim between commit and forget: %d messages, %v", len(again), againErr)
	}
	res, err = b.Store.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: again[0].Topic, ID: id, Attempt: again[0].Attempts, ClaimToken: again[0].ClaimToken},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.LeaseLost) != 0 {
		t.Fatalf("the outcome of the new claim was refused as a lost lease: %v", res.LeaseLost)
	}
	if got := b.Row(t, flowcatalyst.TopicEvent, id); got.Status != seedcore.StatusCompleted {
		t.Fatalf("row is %s, want COMPLETED", got.Status)
	}
}

// ProcessorDeliversEverythingInFIFOOrder: two processors deliver every row
// once, in order per group.
func ProcessorDeliversEverythingInFIFOOrder(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.RequireToken("tok")
	events := map[string]int{"order-1": 30, "order-2": 30, "order-3": 30, "": 20}
	jobs := map[string]int{"customer-1": 25, "": 15}
	b.InsertGroups(t, "EVENT", events)
	b.InsertGroups(t, "DISPATCH_JOB", jobs)

	// Two processors (two replicas) over the same tables.
	for i := range 2 {
		pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 7, Token: flowcatalyst.StaticToken("tok")})
		if err != nil {
			t.Fatal(err)
		}
		cfg := FastConfig()
		cfg.ID = fmt.Sprint("replica-", i)
		cfg.PollBatchSize, cfg.PublishBatchSize, cfg.MaxConcurrentGroups = 20, 7, 3
		Run(t, b.New(t), pub, cfg)
	}
	WaitFor(t, "every row COMPLETED", 30*time.Second, func() bool { return b.CountStatus(t, "COMPLETED") == 150 })
	CheckFIFO(t, srv.Items(flowcatalyst.CurrentAPI.EventsPath), events)
	CheckFIFO(t, srv.Items(flowcatalyst.CurrentAPI.DispatchJobsPath), jobs)
}

// ProcessorRetriesThenFails: a failing row is retried, then dead-lettered,
// and holds its group meanwhile.
func ProcessorRetriesThenFails(t *testing.T, setup func(testing.TB) *Bundle) {
	tests := []struct {
		name  string
		api   flowcatalyst.API
		batch int
		// strict: the group's next row is sent only after the failing row
		// was dead-lettered. Not so with several items per request on the
		// current API: FlowCatalyst stores the next item of the same
		// request while the failing one is retried (documented).
		strict bool
	}{
		{"current", flowcatalyst.CurrentAPI, 100, false},
		{"current one per request", flowcatalyst.CurrentAPI, 1, true},
		{"seed", flowcatalyst.SeedAPI, 100, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := flowcatalysttest.NewServer()
			defer srv.Close()
			var mu sync.Mutex
			var events []string // "poison" per try, "after" when the next row is stored
			record := func(e string) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}
			if tt.api.Body == flowcatalyst.BodyItems {
				srv.OnItem(func(_ *flowcatalysttest.Request, _ int, it json.RawMessage) flowcatalyst.ItemResult {
					if bytes.Contains(it, []byte("poison")) {
						record("poison")
						return flowcatalyst.ItemResult{Status: flowcatalyst.ItemInternalError, Error: "storage unavailable"}
					}
					record("after")
					return flowcatalyst.ItemResult{}
				})
			} else {
				srv.OnRequest(func(r *flowcatalysttest.Request) *flowcatalysttest.Response {
					if bytes.Contains(r.Body, []byte("poison")) {
						record("poison")
						return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"storage unavailable"}`)}
					}
					record("after")
					return nil
				})
			}
			start := time.Now().UTC().Add(-time.Minute)
			poison := b.Insert(t, "DISPATCH_JOB", "G", `{"poison":true}`, start)
			after := b.Insert(t, "DISPATCH_JOB", "G", `{"n":1}`, start.Add(time.Second))
			pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, API: tt.api, BatchSize: tt.batch})
			if err != nil {
				t.Fatal(err)
			}
			Run(t, b.Store, pub, FastConfig())
			WaitFor(t, "the poison row FAILED and the next COMPLETED", 20*time.Second, func() bool {
				return b.Row(t, "DISPATCH_JOB", poison).Status == "FAILED" && b.Row(t, "DISPATCH_JOB", after).Status == "COMPLETED"
			})
			r := b.Row(t, "DISPATCH_JOB", poison)
			if r.RetryCount != 3 || !strings.Contains(r.Error.String, "storage unavailable") {
				t.Errorf("failed row %+v, want retry_count 3 (max-retries) and the server's error", r)
			}
			if r := b.Row(t, "DISPATCH_JOB", after); r.RetryCount != 0 {
				t.Errorf("the next row %+v was charged for the failing one", r)
			}
			mu.Lock()
			defer mu.Unlock()
			if got := strings.Count(strings.Join(events, ","), "poison"); got != 4 {
				t.Errorf("the poison row was tried %d times, want 4 (1 + 3 retries): %v", got, events)
			}
			if tt.strict && fmt.Sprint(events) != "[poison poison poison poison after]" {
				t.Errorf("events %v: the next row of the group was sent before the failing one was dead-lettered", events)
			}
		})
	}
}

// ProcessorRecoversStuckRow: a row left PROCESSING by a crashed processor is
// recovered and sent, its retry_count untouched.
func ProcessorRecoversStuckRow(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	id := b.Insert(t, "EVENT", "G", `{"n":0}`, time.Now().UTC().Add(-time.Hour))
	next := b.Insert(t, "EVENT", "G", `{"n":1}`, time.Now().UTC().Add(-time.Hour+time.Second))
	// A processor crashed while sending it: PROCESSING since 10 minutes.
	b.Exec(t, `UPDATE `+b.Table("EVENT")+` SET status = 'PROCESSING', processed_at = $2 WHERE id = $1`, id, time.Now().UTC().Add(-10*time.Minute))
	pub, _ := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL})
	cfg := FastConfig()
	cfg.ProcessingTimeout, cfg.RecoveryInterval = 5*time.Minute, 100*time.Millisecond
	Run(t, b.Store, pub, cfg)
	WaitFor(t, "the stuck row recovered and COMPLETED", 20*time.Second, func() bool {
		return b.Row(t, "EVENT", id).Status == "COMPLETED" && b.Row(t, "EVENT", next).Status == "COMPLETED"
	})
	if r := b.Row(t, "EVENT", id); r.RetryCount != 0 {
		t.Errorf("recovered row %+v, want retry_count 0 (recovery delays, it does not count an attempt)", r)
	}
	CheckFIFO(t, srv.Items(flowcatalyst.CurrentAPI.EventsPath), map[string]int{"G": 2})
}

// ProcessorReclaimBeforeForget: a processor retries a row at once and
// claims it again while its recorder is still between the finish's commit
// and the moment it forgets the lease of the first claim. processed_at,
// which is the claim's ClaimedAt, has whole seconds on MySQL, so both
// claims of a row can carry the same ClaimedAt: forgetting the first lease
// must not drop the second, or the processor never publishes the second
// claim and the row stays PROCESSING until recovery (the processor tier of
// CI: 42 rows PROCESSING, none PENDING, after 3 minutes).
//
// The store's finish hook holds the recorder after the commit until the row
// has been claimed again, and MaxUnrecordedOutcomes 1 makes the worker of
// the second claim wait until the first outcome is fully recorded (forget
// included) before it publishes. Each trial starts just after a second of
// the clock, so that both claims of its row fall within one second on
// MySQL; trials stop once one did.
func ProcessorReclaimBeforeForget(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	st := b.New(t)
	table := b.Table(flowcatalyst.TopicEvent)
	var mu sync.Mutex
	claims := map[string][]time.Time{} // the ClaimedAt of each attempt, per id
	var current string                 // the row of the running trial
	b.SetBeforeForget(st, func() {
		mu.Lock()
		id := current
		mu.Unlock()
		// Hold the recorder (the finish committed) until the row, retried
		// due at once, is claimed again.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			var status string
			if err := b.QueryRow(b.Q(`SELECT status FROM `+table+` WHERE id = $1`, []any{id})).Scan(&status); err != nil || status != seedcore.StatusPending {
				return
			}
		}
	})
	pub := outbox.PublishEach(func(_ context.Context, m outbox.Message) outbox.Result {
		mu.Lock()
		claims[m.ID] = append(claims[m.ID], m.ClaimedAt)
		first := len(claims[m.ID]) == 1
		mu.Unlock()
		if first {
			return outbox.Result{Err: outbox.Retryable("http_503", "the first attempt fails")}
		}
		return outbox.Result{ProviderMessageID: "prov-" + m.ID}
	})
	cfg := FastConfig()
	cfg.PollInterval = 5 * time.Millisecond
	cfg.Backoff = outbox.Backoff{Schedule: []time.Duration{time.Millisecond}} // due again at once
	cfg.MaxUnrecordedOutcomes = 1
	cfg.Topics = []string{flowcatalyst.TopicEvent}
	cfg.ProcessingTimeout, cfg.RecoveryInterval = 5*time.Minute, 5*time.Minute // no recovery within the test
	Run(t, st, pub, cfg)

	const trials = 5
	same := false
	for trial := 0; trial < trials && !same; trial++ {
		// Start just after a second of the clock (the database's, on this
		// host): claim, retry and claim again then take well under a second.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		id := flowcatalyst.NewTSID().String()
		mu.Lock()
		current = id
		mu.Unlock()
		b.Exec(t, `INSERT INTO `+table+` (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, 'EVENT', 'g', '{}', 'PENDING', 0, $2)`, id, time.Now().UTC().Add(-time.Hour))
		// Sent within 30 s, or never (until its lease expires after 5 min).
		deadline := time.Now().Add(30 * time.Second)
		for b.Row(t, flowcatalyst.TopicEvent, id).Status != seedcore.StatusCompleted {
			if time.Now().After(deadline) {
				mu.Lock()
				c := claims[id]
				mu.Unlock()
				t.Fatalf("trial %d: row %s is %s 30 s later, published with ClaimedAt %v: the second claim was never published (its lease was forgotten with the first)",
					trial, id, b.Row(t, flowcatalyst.TopicEvent, id).Status, c)
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		c := claims[id]
		mu.Unlock()
		if len(c) != 2 {
			t.Fatalf("trial %d: published %d times, want 2", trial, len(c))
		}
		same = c[0].Equal(c[1])
	}
	if !same {
		t.Logf("no trial claimed its row twice with the same ClaimedAt (they differ on PostgreSQL, whose timestamps have microseconds)")
	}
}

// IDsSharedAcrossTablesKeepTheirOwnOutcome: seed 004 makes ids unique per
// table, not across the two: an event and a dispatch job may share one, and
// their outcomes are never swapped.
func IDsSharedAcrossTablesKeepTheirOwnOutcome(t *testing.T, setup func(testing.TB) *Bundle) {
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.OnRequest(func(r *flowcatalysttest.Request) *flowcatalysttest.Response {
		if r.Path == flowcatalyst.CurrentAPI.EventsPath {
			return &flowcatalysttest.Response{Status: 503, Body: []byte(`{"error":"events unavailable"}`)}
		}
		return nil
	})
	start := time.Now().UTC().Add(-time.Hour)
	const n = 20
	for i := 1; i <= n; i++ {
		for _, topic := range []string{"EVENT", "DISPATCH_JOB"} {
			b.Exec(t, `INSERT INTO `+b.Table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, $2, $3, $4, 'PENDING', 0, $5)`, fmt.Sprint("P", i), topic, fmt.Sprint("g", i%4),
				fmt.Sprintf(`{"topic":%q,"n":%d}`, topic, i), start.Add(time.Duration(i)*time.Millisecond))
		}
	}
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	cfg := FastConfig()
	cfg.PollBatchSize, cfg.PublishBatchSize = 12, 5
	stop := Run(t, b.Store, pub, cfg)
	WaitFor(t, "every row finished", 30*time.Second, func() bool {
		return b.CountStatus(t, "FAILED")+b.CountStatus(t, "COMPLETED") == 2*n
	})
	stop()
	if got := srv.Items(flowcatalyst.CurrentAPI.EventsPath); len(got) != 0 {
		t.Errorf("FlowCatalyst stored %d events, want none (every events request failed)", len(got))
	}
	if got := srv.Items(flowcatalyst.CurrentAPI.DispatchJobsPath); len(got) != n {
		t.Errorf("FlowCatalyst stored %d dispatch jobs, want %d", len(got), n)
	}
	for i := 1; i <= n; i++ {
		id := fmt.Sprint("P", i)
		if r := b.Row(t, "EVENT", id); r.Status != "FAILED" || r.RetryCount != 3 || !strings.Contains(r.Error.String, "unavailable") {
			t.Errorf("event %s: %+v, want FAILED after 3 retries (never stored)", id, r)
		}
		if r := b.Row(t, "DISPATCH_JOB", id); r.Status != "COMPLETED" || r.RetryCount != 0 {
			t.Errorf("dispatch job %s: %+v, want COMPLETED with retry_count 0 (stored once)", id, r)
		}
	}
}
