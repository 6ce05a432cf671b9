package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"
)

// Router is a Publisher that sends each message to the publisher registered
// for its topic. A message whose topic has no publisher gets a permanent
// error wrapping ErrNoPublisher. The processor claims only the router's
// topics when Config.Topics is empty, and refuses to start with a router
// that has no routes or a bad registration (see Validate).
type Router struct {
	routes map[string]Publisher
	errs   []error
	// log receives the router's warnings; the processor sets its logger
	// when none is set.
	log atomic.Pointer[slog.Logger]
}

// NewRouter returns an empty Router.
func NewRouter() *Router { return &Router{routes: map[string]Publisher{}} }

// Handle registers p for topic, replacing any earlier registration. It
// returns r for chaining. Register routes before the processor starts. A
// nil p or an empty topic is not registered; the mistake is reported by
// Validate (and so by NewProcessor).
func (r *Router) Handle(topic string, p Publisher) *Router {
	switch {
	case strings.TrimSpace(topic) == "":
		r.errs = append(r.errs, invalid("Router.Handle", "topic is empty"))
	case isNilPublisher(p):
		r.errs = append(r.errs, invalid("Router.Handle", fmt.Sprintf("publisher for topic %q is nil", topic)))
	default:
		r.routes[topic] = p
	}
	return r
}

func isNilPublisher(p Publisher) bool {
	if p == nil {
		return true
	}
	if f, ok := p.(PublisherFunc); ok && f == nil {
		return true
	}
	if r, ok := p.(*Router); ok && r == nil {
		return true
	}
	return false
}

// Validate reports a router that cannot work: no routes, or a Handle call
// with a nil publisher or an empty topic. The error matches ErrInvalidInput.
func (r *Router) Validate() error {
	if r == nil {
		return invalid("publisher", "is a nil *Router")
	}
	if len(r.errs) > 0 {
		return errors.Join(r.errs...)
	}
	if len(r.routes) == 0 {
		return invalid("Router", "has no routes: register a publisher per topic with Handle")
	}
	return nil
}

// SetLogger sets the logger that receives the router's warnings (a
// publisher that returned fewer results than messages). A processor sets its
// own logger on a router that has none.
func (r *Router) SetLogger(l *slog.Logger) { r.log.Store(l) }

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
// merges the results back into msgs' order. A publisher that returns fewer
// results than messages has the missing ones filled with a retryable
// "missing_result" error, and is logged.
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
		if len(res) != len(batch) {
			if l := r.log.Load(); l != nil {
				l.Error("publisher returned a wrong number of results; the missing ones are retried",
					"topic", t, "messages", len(batch), "results", len(res))
			}
		}
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
