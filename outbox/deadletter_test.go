package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// A dead-letter rule that cannot work is refused at start, not discovered
// when the first message fails.
func TestNewProcessorRefusesABadDeadLetterRule(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ok := outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		return make([]outbox.Result, len(ms))
	})
	// A store without the capability: the real store, its
	// DeadLetterBlocking method hidden.
	plain := struct{ outbox.Store }{st}
	block := outbox.DeadLetterRule{Default: outbox.DeadLetterBlock}
	for _, tt := range []struct {
		name  string
		store outbox.Store
		pub   outbox.Publisher
		cfg   outbox.Config
		want  string
	}{
		{"unknown default", st, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{Default: "skip"}}, `"skip" is not a dead-letter policy`},
		{"unknown topic policy", st, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{
			ByTopic: map[string]outbox.DeadLetterPolicy{"a": "Block"}}}, `topic "a": "Block" is not`},
		{"empty policy for a topic", st, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{
			ByTopic: map[string]outbox.DeadLetterPolicy{"a": ""}}}, `topic "a": "" is not`},
		{"topic not claimed", st, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{
			ByTopic: map[string]outbox.DeadLetterPolicy{"b": outbox.DeadLetterBlock}}}, `names topic "b", which this processor does not claim`},
		{"topic not routed", st, outbox.NewRouter().Handle("a", ok), outbox.Config{DeadLetter: outbox.DeadLetterRule{
			ByTopic: map[string]outbox.DeadLetterPolicy{"b": outbox.DeadLetterContinue}}}, `names topic "b"`},
		{"store cannot block", plain, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: block}, "cannot hold a group at a dead letter"},
		{"store cannot block one topic", plain, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{
			ByTopic: map[string]outbox.DeadLetterPolicy{"a": outbox.DeadLetterBlock}}}, "cannot hold a group"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := outbox.NewProcessor(tt.store, tt.pub, tt.cfg)
			if !errors.Is(err, outbox.ErrInvalidInput) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewProcessor = %v, %v; want an ErrInvalidInput mentioning %q", p, err, tt.want)
			}
		})
	}
	// What can work is accepted: blocking on a store that can, continuing
	// on one that cannot, and any topic with AllTopics.
	for _, cfg := range []outbox.Config{
		{Topics: []string{"a"}, DeadLetter: block},
		{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{ByTopic: map[string]outbox.DeadLetterPolicy{"a": outbox.DeadLetterBlock}}},
		{AllTopics: true, DeadLetter: outbox.DeadLetterRule{ByTopic: map[string]outbox.DeadLetterPolicy{"x": outbox.DeadLetterBlock}}},
	} {
		if _, err := outbox.NewProcessor(st, ok, cfg); err != nil {
			t.Fatalf("NewProcessor(%+v): %v", cfg.DeadLetter, err)
		}
	}
	if _, err := outbox.NewProcessor(plain, ok, outbox.Config{Topics: []string{"a"}, DeadLetter: outbox.DeadLetterRule{Default: outbox.DeadLetterContinue}}); err != nil {
		t.Fatalf("continue on a store without the capability: %v", err)
	}
}

func TestDeadLetterRule(t *testing.T) {
	t.Parallel()
	var zero outbox.DeadLetterRule
	if zero.Policy("a") != outbox.DeadLetterContinue || zero.Blocks("a", "g") {
		t.Fatal("the zero rule must continue")
	}
	r := outbox.DeadLetterRule{Default: outbox.DeadLetterBlock, ByTopic: map[string]outbox.DeadLetterPolicy{"c": outbox.DeadLetterContinue}}
	if !r.Blocks("a", "g") || r.Blocks("a", "") || r.Blocks("c", "g") {
		t.Fatal("Blocks: the default blocks ordered groups only; an override continues")
	}
	def, block, cont := r.BlockingTopics()
	if !def || len(block) != 0 || strings.Join(cont, ",") != "c" {
		t.Fatalf("BlockingTopics = %v %v %v", def, block, cont)
	}
}

// The processor applies Config.DeadLetter: under DeadLetterBlock a dead
// letter holds its group until it is requeued, and the requeue keeps the
// group's order (1, 2, 3); under DeadLetterContinue (the default) the group
// moves on and the requeued message comes after its successors (2, 3, 1).
// Another group of the same topic is not held either way.
func TestProcessorDeadLetterPolicy(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		policy outbox.DeadLetterPolicy
		// want: the group's successful sends, before and after the requeue
		before, after []int
	}{
		{outbox.DeadLetterBlock, nil, []int{0, 1, 2}},
		{outbox.DeadLetterContinue, []int{1, 2}, []int{0}},
	} {
		t.Run(string(tt.policy), func(t *testing.T) {
			t.Parallel()
			st := newStore(t)
			ids := enqueue(t, st, 4, func(i int) string { return map[bool]string{true: "g", false: "h"}[i < 3] })
			pos := map[string]int{}
			for i, id := range ids {
				pos[id] = i
			}
			var mu sync.Mutex
			var sentG []int
			sentH, failedOnce := 0, false
			pub := outbox.PublishEach(func(_ context.Context, m outbox.Message) outbox.Result {
				mu.Lock()
				defer mu.Unlock()
				if m.ID == ids[0] && !failedOnce {
					failedOnce = true
					return outbox.Result{Err: outbox.Permanent("131026", "undeliverable")}
				}
				if m.Group == "g" {
					sentG = append(sentG, pos[m.ID])
				} else {
					sentH++
				}
				return outbox.Result{ProviderMessageID: "p-" + m.ID}
			})
			obs := &blockObserver{}
			p, err := outbox.NewProcessor(st, pub, outbox.Config{
				Topics: []string{"t"}, PollInterval: 10 * time.Millisecond, Observer: obs,
				DeadLetter: outbox.DeadLetterRule{ByTopic: map[string]outbox.DeadLetterPolicy{"t": tt.policy}},
			})
			if err != nil {
				t.Fatal(err)
			}
			stop := start(t, p)
			defer stop()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.WaitDrained(ctx); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			if fmt.Sprint(sentG) != fmt.Sprint(tt.before) || sentH != 1 {
				t.Fatalf("before the requeue: group g sent %v, want %v; group h sent %d, want 1", sentG, tt.before, sentH)
			}
			sentG = nil
			mu.Unlock()
			dead, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: ids[0]})
			block := tt.policy == outbox.DeadLetterBlock
			if err != nil || dead.Status != outbox.StatusFailed || dead.BlocksGroup != block {
				t.Fatalf("dead letter: %s BlocksGroup %v, %v; want FAILED %v", dead.Status, dead.BlocksGroup, err, block)
			}
			if got := obs.blocks(); got != fmt.Sprint([]bool{block}) {
				t.Fatalf("OnFailed saw BlocksGroup %s, want [%v]", got, block)
			}
			if _, err := st.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: ids[0]}); err != nil {
				t.Fatal(err)
			}
			if err := p.WaitDrained(ctx); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(sentG) != fmt.Sprint(tt.after) {
				t.Fatalf("after the requeue: group g sent %v, want %v", sentG, tt.after)
			}
		})
	}
}

type blockObserver struct {
	outbox.NopObserver
	mu     sync.Mutex
	failed []bool
}

func (o *blockObserver) OnFailed(_ context.Context, ev outbox.AttemptEvent) {
	o.mu.Lock()
	o.failed = append(o.failed, ev.Message.BlocksGroup)
	o.mu.Unlock()
}

func (o *blockObserver) blocks() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.failed)
}
