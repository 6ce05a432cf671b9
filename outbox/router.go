package outbox

import (
	"context"
	"fmt"
	"sort"
)

// Router is a Publisher that sends each message to the publisher registered
// for its topic. A message whose topic has no publisher gets a permanent
// error wrapping ErrNoPublisher. The processor claims only the router's
// topics when Config.Topics is empty.
type Router struct {
	routes map[string]Publisher
}

// NewRouter returns an empty Router.
func NewRouter() *Router { return &Router{routes: map[string]Publisher{}} }

// Handle registers p for topic, replacing any earlier registration. It
// returns r for chaining. Register routes before the processor starts.
func (r *Router) Handle(topic string, p Publisher) *Router {
	r.routes[topic] = p
	return r
}

// Topics returns the registered topics, sorted.
func (r *Router) Topics() []string {
	ts := make([]string, 0, len(r.routes))
	for t := range r.routes {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// Publish splits msgs by topic, keeping their order within a topic, and
// merges the results back into msgs' order.
func (r *Router) Publish(ctx context.Context, msgs []Message) []Result {
	out := make([]Result, len(msgs))
	byTopic := map[string][]int{}
	var order []string
	for i := range msgs {
		t := msgs[i].Topic
		if _, ok := byTopic[t]; !ok {
			order = append(order, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	for _, t := range order {
		idx := byTopic[t]
		p, ok := r.routes[t]
		if !ok {
			for _, i := range idx {
				out[i] = Result{Err: &PublishError{Code: "no_publisher", Message: fmt.Sprintf("no publisher for topic %q", t), Permanent: true, Err: ErrNoPublisher}}
			}
			continue
		}
		batch := make([]Message, len(idx))
		for j, i := range idx {
			batch[j] = msgs[i]
		}
		res := p.Publish(ctx, batch)
		for j, i := range idx {
			if j < len(res) {
				out[i] = res[j]
			} else {
				out[i] = Result{Err: Retryable("missing_result", "the publisher returned fewer results than messages")}
			}
		}
	}
	return out
}
