package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestRouterSplitsByTopicKeepingOrder(t *testing.T) {
	t.Parallel()
	var gotA, gotB []string
	a := PublisherFunc(func(_ context.Context, ms []Message) []Result {
		out := make([]Result, len(ms))
		for i, m := range ms {
			gotA = append(gotA, m.ID)
			out[i] = Result{ProviderMessageID: "a-" + m.ID}
		}
		return out
	})
	b := PublisherFunc(func(_ context.Context, ms []Message) []Result {
		for _, m := range ms {
			gotB = append(gotB, m.ID)
		}
		return []Result{{ProviderMessageID: "b-" + ms[0].ID}} // one result short
	})
	r := NewRouter().Handle("a", a).Handle("b", b)
	if ts := r.Topics(); len(ts) != 2 || ts[0] != "a" || ts[1] != "b" {
		t.Fatalf("Topics = %v", ts)
	}
	msgs := []Message{{ID: "1", Topic: "a"}, {ID: "2", Topic: "b"}, {ID: "3", Topic: "a"}, {ID: "4", Topic: "zzz"}, {ID: "5", Topic: "b"}}
	res := r.Publish(context.Background(), msgs)
	if len(res) != len(msgs) {
		t.Fatalf("%d results", len(res))
	}
	if res[0].ProviderMessageID != "a-1" || res[2].ProviderMessageID != "a-3" || res[1].ProviderMessageID != "b-2" {
		t.Fatalf("results not merged back in order: %+v", res)
	}
	if !errors.Is(res[3].Err, ErrNoPublisher) || IsRetryable(res[3].Err) {
		t.Fatalf("unknown topic: %v", res[3].Err)
	}
	if res[4].Err == nil || !IsRetryable(res[4].Err) {
		t.Fatalf("missing result must be a retryable error: %v", res[4].Err)
	}
	if len(gotA) != 2 || gotA[0] != "1" || gotA[1] != "3" || len(gotB) != 2 {
		t.Fatalf("calls: a=%v b=%v", gotA, gotB)
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	if c.PollInterval.String() != "1s" || c.PollBatchSize != 500 || c.PublishBatchSize != 100 ||
		c.MaxConcurrentGroups != 10 || c.BufferSize != 1000 || c.ProcessingTimeout.String() != "5m0s" ||
		c.RecoveryInterval.String() != "1m0s" || c.MaxAttempts != DefaultMaxAttempts || c.ID == "" {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// The drain stays inside the lease: a short lease shortens the default.
	if c := (Config{ProcessingTimeout: 10 * time.Second}).WithDefaults(); c.DrainTimeout != 5*time.Second || c.Validate() != nil {
		t.Fatalf("DrainTimeout with a 10s lease: %s, %v", c.DrainTimeout, c.Validate())
	}
	bad := []Config{
		{PollBatchSize: -1}, {BufferSize: -5}, {PollInterval: -1}, {MaxAttempts: MaxAttemptsLimit + 1},
		{Backoff: Backoff{Jitter: 2}}, {Topics: []string{""}},
		{ProcessingTimeout: time.Minute, DrainTimeout: time.Minute}, {DrainTimeout: 10 * time.Minute},
	}
	for _, b := range bad {
		err := b.WithDefaults().Validate()
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%+v: want a ValidationError, got %v", b, err)
		}
	}
	if _, err := NewProcessor(nil, NewRouter(), Config{}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("nil store: %v", err)
	}
}

func TestPublishEachStopsAGroupAtItsFirstFailure(t *testing.T) {
	t.Parallel()
	var sent []string
	p := PublishEach(func(_ context.Context, m Message) Result {
		sent = append(sent, m.ID)
		if m.ID == "a1" {
			return Result{Err: Retryable("x", "down")}
		}
		return Result{ProviderMessageID: "p" + m.ID}
	})
	msgs := []Message{
		{ID: "a1", Group: "a"}, {ID: "b1", Group: "b"}, {ID: "a2", Group: "a"}, {ID: "u1"}, {ID: "b2", Group: "b"},
	}
	res := p.Publish(context.Background(), msgs)
	if got := strings.Join(sent, ","); got != "a1,b1,u1,b2" {
		t.Fatalf("sent %s: a2 must not be sent after a1 failed", got)
	}
	if !errors.Is(res[2].Err, ErrNotAttempted) || res[1].Err != nil || res[4].ProviderMessageID != "pb2" {
		t.Fatalf("results: %+v", res)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res := p.Publish(ctx, msgs[:1]); !errors.Is(res[0].Err, context.Canceled) || !errors.Is(res[0].Err, ErrNotAttempted) {
		t.Fatalf("cancelled ctx: %+v", res)
	}
}

func TestPublishWavesKeepsGroupOrderAndStopsFailedGroups(t *testing.T) {
	t.Parallel()
	msgs := []Message{
		{ID: "a1", Group: "a"}, {ID: "a2", Group: "a"}, {ID: "u1"}, {ID: "b1", Group: "b"},
		{ID: "a3", Group: "a"}, {ID: "b2", Group: "b"}, {ID: "u2"},
	}
	var calls [][]string
	res := PublishWaves(context.Background(), msgs, 2, func(_ context.Context, idx []int, out []Result) {
		var ids []string
		for _, i := range idx {
			ids = append(ids, msgs[i].ID)
			if msgs[i].ID == "b1" {
				out[i].Err = Retryable("x", "down")
			}
		}
		calls = append(calls, ids)
	})
	got := fmt.Sprint(calls)
	// wave 0: a1 u1 b1 u2 (chunks of 2); wave 1: a2 (b2 stopped); wave 2: a3
	if got != "[[a1 u1] [b1 u2] [a2] [a3]]" {
		t.Fatalf("calls %s", got)
	}
	if !errors.Is(res[5].Err, ErrNotAttempted) || res[4].Err != nil || res[3].Err == nil {
		t.Fatalf("results %+v", res)
	}
}
