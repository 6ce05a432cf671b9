package seedstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// run starts a processor over st and returns a function that stops it and
// waits for Run to return.
func run(t *testing.T, st *seedstore.Store, pub outbox.Publisher, cfg outbox.Config) func() {
	t.Helper()
	p, err := outbox.NewProcessor(st, pub, cfg)
	if err != nil {
		t.Fatalf("NewProcessor: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return 30 s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func fastConfig() outbox.Config {
	return outbox.Config{
		PollInterval:      20 * time.Millisecond,
		ProcessingTimeout: time.Minute,
		RecoveryInterval:  time.Minute,
		DrainTimeout:      5 * time.Second,
		MaxAttempts:       4, // max-retries 3
		Backoff:           outbox.Backoff{Schedule: []time.Duration{20 * time.Millisecond}},
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bundle) countStatus(t *testing.T, status string) int {
	t.Helper()
	var n int
	err := b.dbQueryRow(b.q(`SELECT (SELECT count(*) FROM `+b.table("EVENT")+` WHERE status = $1) + (SELECT count(*) FROM `+b.table("DISPATCH_JOB")+` WHERE status = $1)`, []any{status})).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type item struct {
	Group string `json:"group"`
	N     int    `json:"n"`
}

// checkFIFO asserts every inserted item was stored exactly once and, per
// group, in insertion order.
func checkFIFO(t *testing.T, stored []json.RawMessage, want map[string]int) {
	t.Helper()
	next := map[string]int{}
	seen := map[string]bool{}
	for _, raw := range stored {
		var it item
		if err := json.Unmarshal(raw, &it); err != nil {
			t.Fatalf("stored item %s: %v", raw, err)
		}
		key := fmt.Sprint(it.Group, "/", it.N)
		if seen[key] {
			t.Errorf("item %s stored twice", key)
		}
		seen[key] = true
		if it.Group != "" {
			if it.N != next[it.Group] {
				t.Errorf("group %s: item %d stored after item %d: FIFO broken", it.Group, it.N, next[it.Group]-1)
			}
			next[it.Group] = it.N + 1
		}
	}
	total := 0
	for _, n := range want {
		total += n
	}
	if len(seen) != total {
		t.Errorf("stored %d distinct items, want %d", len(seen), total)
	}
}

// insertGroups inserts per[g] rows for each group g, interleaved in time.
func (b *bundle) insertGroups(t *testing.T, topic string, per map[string]int) {
	t.Helper()
	at := time.Now().UTC().Add(-time.Hour)
	for i := 0; ; i++ {
		any := false
		for g, n := range per {
			if i >= n {
				continue
			}
			any = true
			at = at.Add(time.Millisecond)
			b.insert(t, topic, g, fmt.Sprintf(`{"group":%q,"n":%d,"source":"test"}`, g, i), at)
		}
		if !any {
			return
		}
	}
}

func TestProcessorDeliversEverythingInFIFOOrder(t *testing.T) {
	t.Parallel()
	testProcessorDeliversEverythingInFIFOOrder(t, setup)
}

func testProcessorDeliversEverythingInFIFOOrder(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.RequireToken("tok")
	events := map[string]int{"order-1": 30, "order-2": 30, "order-3": 30, "": 20}
	jobs := map[string]int{"customer-1": 25, "": 15}
	b.insertGroups(t, "EVENT", events)
	b.insertGroups(t, "DISPATCH_JOB", jobs)

	// Two processors (two replicas) over the same tables.
	for i := range 2 {
		pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 7, Token: flowcatalyst.StaticToken("tok")})
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastConfig()
		cfg.ID = fmt.Sprint("replica-", i)
		cfg.PollBatchSize, cfg.PublishBatchSize, cfg.MaxConcurrentGroups = 20, 7, 3
		run(t, b.newStore(t), pub, cfg)
	}
	waitFor(t, "every row COMPLETED", 30*time.Second, func() bool { return b.countStatus(t, "COMPLETED") == 150 })
	checkFIFO(t, srv.Items(flowcatalyst.CurrentAPI.EventsPath), events)
	checkFIFO(t, srv.Items(flowcatalyst.CurrentAPI.DispatchJobsPath), jobs)
}

func TestProcessorRetriesThenFails(t *testing.T) {
	t.Parallel()
	testProcessorRetriesThenFails(t, setup)
}

func testProcessorRetriesThenFails(t *testing.T, setup func(testing.TB) *bundle) {
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
			poison := b.insert(t, "DISPATCH_JOB", "G", `{"poison":true}`, start)
			after := b.insert(t, "DISPATCH_JOB", "G", `{"n":1}`, start.Add(time.Second))
			pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, API: tt.api, BatchSize: tt.batch})
			if err != nil {
				t.Fatal(err)
			}
			run(t, b.store, pub, fastConfig())
			waitFor(t, "the poison row FAILED and the next COMPLETED", 20*time.Second, func() bool {
				return b.row(t, "DISPATCH_JOB", poison).Status == "FAILED" && b.row(t, "DISPATCH_JOB", after).Status == "COMPLETED"
			})
			r := b.row(t, "DISPATCH_JOB", poison)
			if r.RetryCount != 3 || !strings.Contains(r.Error.String, "storage unavailable") {
				t.Errorf("failed row %+v, want retry_count 3 (max-retries) and the server's error", r)
			}
			if r := b.row(t, "DISPATCH_JOB", after); r.RetryCount != 0 {
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

func TestProcessorRecoversStuckRow(t *testing.T) {
	t.Parallel()
	testProcessorRecoversStuckRow(t, setup)
}

func testProcessorRecoversStuckRow(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	id := b.insert(t, "EVENT", "G", `{"n":0}`, time.Now().UTC().Add(-time.Hour))
	next := b.insert(t, "EVENT", "G", `{"n":1}`, time.Now().UTC().Add(-time.Hour+time.Second))
	// A processor crashed while sending it: PROCESSING since 10 minutes.
	b.exec(t, `UPDATE `+b.table("EVENT")+` SET status = 'PROCESSING', processed_at = $2 WHERE id = $1`, id, time.Now().UTC().Add(-10*time.Minute))
	pub, _ := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL})
	cfg := fastConfig()
	cfg.ProcessingTimeout, cfg.RecoveryInterval = 5*time.Minute, 100*time.Millisecond
	run(t, b.store, pub, cfg)
	waitFor(t, "the stuck row recovered and COMPLETED", 20*time.Second, func() bool {
		return b.row(t, "EVENT", id).Status == "COMPLETED" && b.row(t, "EVENT", next).Status == "COMPLETED"
	})
	if r := b.row(t, "EVENT", id); r.RetryCount != 0 {
		t.Errorf("recovered row %+v, want retry_count 0 (recovery delays, it does not count an attempt)", r)
	}
	checkFIFO(t, srv.Items(flowcatalyst.CurrentAPI.EventsPath), map[string]int{"G": 2})
}

func TestProcessorSmallBufferLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		return &flowcatalysttest.Response{Delay: 3 * time.Millisecond, Continue: true}
	})
	groups := map[string]int{}
	for g := range 10 {
		groups[fmt.Sprint("g", g)] = 15
	}
	groups[""] = 30
	b.insertGroups(t, "EVENT", groups)
	pub, _ := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 2})
	cfg := fastConfig()
	cfg.BufferSize, cfg.PollBatchSize, cfg.PublishBatchSize, cfg.MaxConcurrentGroups = 4, 4, 2, 2
	run(t, b.store, pub, cfg)
	waitFor(t, "every row COMPLETED", 60*time.Second, func() bool { return b.countStatus(t, "COMPLETED") == 180 })
	checkFIFO(t, srv.Items(flowcatalyst.CurrentAPI.EventsPath), groups)
}

func TestProcessorReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	testProcessorReclaimBeforeForget(t, setup)
}

// testProcessorReclaimBeforeForget: a processor retries a row at once and
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
func testProcessorReclaimBeforeForget(t *testing.T, setup func(testing.TB) *bundle) {
	b := setup(t)
	st := b.newStore(t)
	table := b.table(flowcatalyst.TopicEvent)
	var mu sync.Mutex
	claims := map[string][]time.Time{} // the ClaimedAt of each attempt, per id
	var current string                 // the row of the running trial
	seedstore.SetBeforeForget(st, func() {
		mu.Lock()
		id := current
		mu.Unlock()
		// Hold the recorder (the finish committed) until the row, retried
		// due at once, is claimed again.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			var status string
			if err := b.dbQueryRow(b.q(`SELECT status FROM `+table+` WHERE id = $1`, []any{id})).Scan(&status); err != nil || status != seedstore.StatusPending {
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
	cfg := fastConfig()
	cfg.PollInterval = 5 * time.Millisecond
	cfg.Backoff = outbox.Backoff{Schedule: []time.Duration{time.Millisecond}} // due again at once
	cfg.MaxUnrecordedOutcomes = 1
	cfg.Topics = []string{flowcatalyst.TopicEvent}
	cfg.ProcessingTimeout, cfg.RecoveryInterval = 5*time.Minute, 5*time.Minute // no recovery within the test
	run(t, st, pub, cfg)

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
		b.exec(t, `INSERT INTO `+table+` (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, 'EVENT', 'g', '{}', 'PENDING', 0, $2)`, id, time.Now().UTC().Add(-time.Hour))
		// Sent within 30 s, or never (until its lease expires after 5 min).
		deadline := time.Now().Add(30 * time.Second)
		for b.row(t, flowcatalyst.TopicEvent, id).Status != seedstore.StatusCompleted {
			if time.Now().After(deadline) {
				mu.Lock()
				c := claims[id]
				mu.Unlock()
				t.Fatalf("trial %d: row %s is %s 30 s later, published with ClaimedAt %v: the second claim was never published (its lease was forgotten with the first)",
					trial, id, b.row(t, flowcatalyst.TopicEvent, id).Status, c)
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
