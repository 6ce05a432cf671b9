package storetest

import (
	"context"
	"sync"
	"testing"

	"github.com/outboxkit/outboxkit/outbox"
)

// topicMap maps the topic names of one case onto a store's fixed topics
// (Features.Topics), in order of first use, and back.
type topicMap struct {
	t     *testing.T
	store []string

	mu   sync.Mutex
	to   map[string]string // suite name -> store topic
	from map[string]string // store topic -> suite name
}

// out returns the store topic of name. A name not seen before takes the
// next free store topic when assign is set (on the test's goroutine: a
// case needing more topics than the store has is skipped); otherwise it
// is returned unchanged (the store knows no such topic).
func (m *topicMap) out(name string, assign bool) string {
	s, ok := m.lookup(name, assign)
	if !ok {
		m.t.Skipf("storetest: the store lacks the capability %q: the case needs more than its %d topics %v", CapAnyTopic, len(m.store), m.store)
	}
	return s
}

// lookup is out without the skip: false when every store topic is taken.
func (m *topicMap) lookup(name string, assign bool) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.to[name]; ok || name == "" {
		return s, true
	}
	if !assign {
		return name, true
	}
	if len(m.to) == len(m.store) {
		return "", false
	}
	s := m.store[len(m.to)]
	m.to[name], m.from[s] = s, name
	return s, true
}

func (m *topicMap) outAll(names []string) []string {
	if names == nil {
		return nil
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = m.out(n, false)
	}
	return out
}

// back returns the suite's name of a store topic.
func (m *topicMap) back(s string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.from[s]; ok {
		return n
	}
	return s
}

func (m *topicMap) backMsg(msg outbox.Message) outbox.Message {
	msg.Topic = m.back(msg.Topic)
	return msg
}

func (m *topicMap) backAll(msgs []outbox.Message) []outbox.Message {
	for i := range msgs {
		msgs[i] = m.backMsg(msgs[i])
	}
	return msgs
}

// mapTopics wraps b's Store and Enqueuer so that the store sees only
// topics.
func mapTopics[TTx any](t *testing.T, b Backend[TTx], topics []string) Backend[TTx] {
	m := &topicMap{t: t, store: topics, to: map[string]string{}, from: map[string]string{}}
	b.Store = topicStore{Store: b.Store, m: m}
	b.Enqueuer = topicEnqueuer[TTx]{e: b.Enqueuer, m: m}
	return b
}

type topicEnqueuer[TTx any] struct {
	e outbox.Enqueuer[TTx]
	m *topicMap
}

func (q topicEnqueuer[TTx]) params(p outbox.MessageEnqueueParams) outbox.MessageEnqueueParams {
	msgs := make([]outbox.Message, len(p.Messages))
	for i, msg := range p.Messages {
		msg.Topic = q.m.out(msg.Topic, true)
		msgs[i] = msg
	}
	p.Messages = msgs
	return p
}

func (q topicEnqueuer[TTx]) back(res []outbox.Enqueued, err error) ([]outbox.Enqueued, error) {
	for i := range res {
		res[i].Message = q.m.backMsg(res[i].Message)
	}
	return res, err
}

func (q topicEnqueuer[TTx]) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return q.back(q.e.MessageEnqueue(ctx, q.params(p)))
}

func (q topicEnqueuer[TTx]) MessageEnqueueTx(ctx context.Context, tx TTx, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return q.back(q.e.MessageEnqueueTx(ctx, tx, q.params(p)))
}

// topicStore is an outbox.Store that maps topics with m.
type topicStore struct {
	outbox.Store
	m *topicMap
}

func (s topicStore) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	p.Topics = s.m.outAll(p.Topics)
	msgs, err := s.Store.MessageClaim(ctx, p)
	return s.m.backAll(msgs), err
}

func (s topicStore) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	outs := append([]outbox.Outcome(nil), p.Outcomes...)
	for i := range outs {
		outs[i].Topic = s.m.out(outs[i].Topic, false)
	}
	p.Outcomes = outs
	return s.Store.MessageFinish(ctx, p)
}

func (s topicStore) MessageGet(ctx context.Context, p outbox.MessageGetParams) (outbox.Message, error) {
	msg, err := s.Store.MessageGet(ctx, p)
	return s.m.backMsg(msg), err
}

func (s topicStore) MessageList(ctx context.Context, p outbox.MessageListParams) (outbox.MessagePage, error) {
	if p.Topic != "" {
		p.Topic = s.m.out(p.Topic, false)
	}
	page, err := s.Store.MessageList(ctx, p)
	page.Messages = s.m.backAll(page.Messages)
	return page, err
}

func (s topicStore) MessageRequeue(ctx context.Context, p outbox.MessageRequeueParams) (outbox.Message, error) {
	msg, err := s.Store.MessageRequeue(ctx, p)
	return s.m.backMsg(msg), err
}

func (s topicStore) MessageCancel(ctx context.Context, p outbox.MessageCancelParams) (outbox.Message, error) {
	msg, err := s.Store.MessageCancel(ctx, p)
	return s.m.backMsg(msg), err
}

func (s topicStore) MessageApplyReceipt(ctx context.Context, p outbox.MessageApplyReceiptParams) (outbox.ReceiptResult, error) {
	res, err := s.Store.MessageApplyReceipt(ctx, p)
	res.Message = s.m.backMsg(res.Message)
	return res, err
}
