package mongo_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// TestPendingTopicsOldestDue: each topic's count covers its due PENDING
// messages across tenants, its oldest due time is the earliest of them
// (not the first enqueued), a topic with none due is absent, and an
// excluded topic is left out.
func TestPendingTopicsOldestDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := newStore(t, mongo.Options{})
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	msg := func(tenant, topic, group string, due time.Duration) outbox.Message {
		return outbox.Message{Tenant: tenant, Topic: topic, Group: group, Payload: []byte(`{}`), NextAttemptAt: t0.Add(due)}
	}
	msgs := []outbox.Message{
		msg("", "t", "g", time.Second), msg("other", "t", "", -2*time.Second), msg("", "t", "", 0),
		msg("", "u", "", -time.Second), msg("", "u", "h", -time.Second),
		msg("", "x", "", time.Hour),
	}
	if _, err := st.MessageEnqueue(ctx, outbox.MessageEnqueueParams{Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	got, err := st.MessagePendingTopics(ctx, outbox.MessagePendingTopicsParams{DueBefore: t0.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.PendingTopic{{Topic: "t", Messages: 3, OldestDueAt: t0.Add(-2 * time.Second)}, {Topic: "u", Messages: 2, OldestDueAt: t0.Add(-time.Second)}}
	if len(got) != len(want) {
		t.Fatalf("pending topics = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Topic != want[i].Topic || got[i].Messages != want[i].Messages || !got[i].OldestDueAt.Equal(want[i].OldestDueAt) {
			t.Fatalf("pending topics = %+v, want %+v", got, want)
		}
	}
	got, err = st.MessagePendingTopics(ctx, outbox.MessagePendingTopicsParams{DueBefore: t0.Add(time.Minute), ExcludeTopics: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Topic != "u" || got[0].Messages != 2 {
		t.Fatalf("pending topics excluding t = %+v, want u only", got)
	}
}
