package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// TestLogProtoLateCommit: the design's window starts at the first message
// a claim saw unfinished, less a margin, so a message whose transaction drew
// its seq early and committed after the claims had moved on is behind the
// window. The backstop (one probe per known group) still finds it, and its
// group's registry row commits with it.
func TestLogProtoLateCommit(t *testing.T) {
	ctx := context.Background()
	pool, err := newPool(ctx, testbackend.PostgresDSN(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, cleanup, err := newLogProto(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()

	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	var lateSeq int64
	if err := late.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %[1]s.log (id, tenant, topic, grp, payload) VALUES ('late', '', 'bench', 'late', '{}') RETURNING seq;
		`, s.schema)).Scan(&lateSeq); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.groups VALUES ('', 'bench', 'late') ON CONFLICT DO NOTHING`, s.schema)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i += 100 {
		msgs := make([]outbox.Message, 100)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench", Group: groupNames[(i+j)%50], Payload: []byte(`{}`)}
		}
		if err := s.enqueue(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	cl := &lpClaimer{s: s, window: 3000, perGrp: 100, limit: 500, margin: 1000}
	drain := func() map[string]bool {
		got := map[string]bool{}
		for {
			msgs, runs, token, err := cl.claim(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 0 {
				return got
			}
			for _, m := range msgs {
				if got[m.ID] {
					t.Fatalf("message %s claimed twice", m.ID)
				}
				got[m.ID] = true
			}
			if err := s.finish(ctx, runs, token); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(drain()); n != 3000 {
		t.Fatalf("claimed %d of the 3,000 committed messages", n)
	}
	if cl.floor <= lateSeq+int64(cl.margin) {
		t.Fatalf("the floor is %d: the window still covers the late message (seq %d), the test proves nothing", cl.floor, lateSeq)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cl.nextRescan = time.Now().Add(time.Hour)
	if got := drain(); len(got) != 0 {
		t.Fatalf("the window claimed %v: it should be past the late message", got)
	}
	cl.nextRescan = time.Time{}
	if got := drain(); !got["late"] || len(got) != 1 {
		t.Fatalf("the backstop claimed %v, want the late message only", got)
	}
}

// TestLogProtoLeaseDoesNotHoldTheFloor: a group leased for long (a slow
// publisher) must not hold the log window back, or every message more than
// a window behind it would wait; and once its run is done, the rest of the
// group, now far behind the window, is found through the done mark, not
// by the backstop.
func TestLogProtoLeaseDoesNotHoldTheFloor(t *testing.T) {
	ctx := context.Background()
	pool, err := newPool(ctx, testbackend.PostgresDSN(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, cleanup, err := newLogProto(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	slow := []outbox.Message{{Topic: "bench", Group: "slow", Payload: []byte(`{}`)}, {Topic: "bench", Group: "slow", Payload: []byte(`{}`)}}
	if err := s.enqueue(ctx, slow); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i += 100 { // 30 groups of 100 in a row: the window of 1,000 sees 10 at a time
		msgs := make([]outbox.Message, 100)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench", Group: groupNames[i/100], Payload: []byte(`{}`)}
		}
		if err := s.enqueue(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	a := &lpClaimer{s: s, window: 1000, perGrp: 1, limit: 1, margin: 100}
	held, heldRuns, heldToken, err := a.claim(ctx)
	if err != nil || len(held) != 1 || held[0].Group != "slow" {
		t.Fatalf("the slow claimer took %v, %v; want the slow group's first message", held, err)
	}
	b := &lpClaimer{s: s, window: 1000, perGrp: 100, limit: 500, margin: 100, nextRescan: time.Now().Add(time.Hour)}
	drain := func() map[string]bool {
		got := map[string]bool{}
		for {
			msgs, runs, token, err := b.claim(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 0 {
				return got
			}
			for _, m := range msgs {
				got[m.Group+"/"+m.ID] = true
			}
			if err := s.finish(ctx, runs, token); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(drain()); n != 3000 {
		t.Fatalf("with one group leased, the other claimer took %d of the 3,000 other messages", n)
	}
	if err := s.finish(ctx, heldRuns, heldToken); err != nil {
		t.Fatal(err)
	}
	got := drain()
	if len(got) != 1 || !got["slow/"+rest(t, pool, s, "slow")] {
		t.Fatalf("after the slow run was done the other claimer took %v, want the slow group's second message", got)
	}
}

// rest returns the ID of group's last message.
func rest(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, s *lpStore, group string) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT id FROM %s.log WHERE grp = $1 ORDER BY seq DESC LIMIT 1`, s.schema), group).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
