// Package wake is the in-process wake-up signal the database/sql stores
// share: a store calls Notify after a change that may make messages
// claimable; processors receive on the channels Subscribe returns.
package wake

import (
	"context"
	"sync"
)

// Hub broadcasts coalesced wake-ups to its subscribers. The zero value is
// not usable; call New.
type Hub struct {
	mu        sync.Mutex
	closed    bool
	done      chan struct{}
	listeners map[chan struct{}]struct{}
}

// New returns an open Hub.
func New() *Hub {
	return &Hub{done: make(chan struct{}), listeners: map[chan struct{}]struct{}{}}
}

// Subscribe returns a channel that receives a value soon after Notify;
// signals are coalesced (a slow reader sees one value for many). The
// channel is closed when ctx ends or the Hub is closed.
func (h *Hub) Subscribe(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		close(ch)
		return ch
	}
	h.listeners[ch] = struct{}{}
	h.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-h.done:
		}
		h.mu.Lock()
		if _, ok := h.listeners[ch]; ok {
			delete(h.listeners, ch)
			close(ch)
		}
		h.mu.Unlock()
	}()
	return ch
}

// Notify wakes every subscriber. It never blocks.
func (h *Hub) Notify() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.listeners {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Close closes every subscriber's channel; later subscriptions get a closed
// channel. It reports false when the Hub was already closed.
func (h *Hub) Close() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.closed = true
	close(h.done)
	for ch := range h.listeners {
		delete(h.listeners, ch)
		close(ch)
	}
	return true
}
