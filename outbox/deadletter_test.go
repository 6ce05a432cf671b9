package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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
