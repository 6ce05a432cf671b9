package seedstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/outbox"
)

// Seed 004 makes ids unique per table, not across the two: an event and a
// dispatch job may share one. Their outcomes must never be swapped.
func TestIDsSharedAcrossTablesKeepTheirOwnOutcome(t *testing.T) {
	t.Parallel()
	testIDsSharedAcrossTablesKeepTheirOwnOutcome(t, setup)
}

func testIDsSharedAcrossTablesKeepTheirOwnOutcome(t *testing.T, setup func(testing.TB) *bundle) {
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
			b.exec(t, `INSERT INTO `+b.table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
VALUES ($1, $2, $3, $4, 'PENDING', 0, $5)`, fmt.Sprint("P", i), topic, fmt.Sprint("g", i%4),
				fmt.Sprintf(`{"topic":%q,"n":%d}`, topic, i), start.Add(time.Duration(i)*time.Millisecond))
		}
	}
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.PollBatchSize, cfg.PublishBatchSize = 12, 5
	stop := run(t, b.store, pub, cfg)
	waitFor(t, "every row finished", 30*time.Second, func() bool {
		return b.countStatus(t, "FAILED")+b.countStatus(t, "COMPLETED") == 2*n
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
		if r := b.row(t, "EVENT", id); r.Status != "FAILED" || r.RetryCount != 3 || !strings.Contains(r.Error.String, "unavailable") {
			t.Errorf("event %s: %+v, want FAILED after 3 retries (never stored)", id, r)
		}
		if r := b.row(t, "DISPATCH_JOB", id); r.Status != "COMPLETED" || r.RetryCount != 0 {
			t.Errorf("dispatch job %s: %+v, want COMPLETED with retry_count 0 (stored once)", id, r)
		}
	}
}

// One MessageFinish call may carry the outcomes of an event and a dispatch
// job with the same id: each applies to its own table.
func TestFinishTakesSharedIDsInOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO `+b.table("EVENT")+` (id, type, payload, status, created_at) VALUES ('S1', 'EVENT', '{}', 'PENDING', $1)`, t0)
	b.exec(t, `INSERT INTO `+b.table("DISPATCH_JOB")+` (id, type, payload, status, created_at) VALUES ('S1', 'DISPATCH_JOB', '{}', 'PENDING', $1)`, t0)
	got := claim(t, b.store, 10, t0)
	if len(got) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(got))
	}
	p := outbox.MessageFinishParams{Owner: "p", Now: time.Now()}
	for _, m := range got {
		o := outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts}
		if m.Topic == flowcatalyst.TopicDispatchJob {
			o.Kind, o.Error = outbox.OutcomeDead, &outbox.ErrorInfo{Code: "400", Message: "bad"}
		}
		p.Outcomes = append(p.Outcomes, o)
	}
	res, err := b.store.MessageFinish(context.Background(), p)
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("MessageFinish: %+v, %v", res, err)
	}
	if ev, job := b.row(t, "EVENT", "S1"), b.row(t, "DISPATCH_JOB", "S1"); ev.Status != "COMPLETED" || job.Status != "FAILED" {
		t.Errorf("event %s, job %s; want COMPLETED and FAILED", ev.Status, job.Status)
	}
	// Two outcomes for one row are still refused.
	p = outbox.MessageFinishParams{Owner: "p", Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: "EVENT", ID: "S1", Attempt: 1}, {Kind: outbox.OutcomeSent, Topic: "EVENT", ID: "S1", Attempt: 1},
	}}
	if _, err := b.store.MessageFinish(context.Background(), p); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Errorf("two outcomes for one row: %v", err)
	}
}
