package wake

import (
	"context"
	"testing"
	"time"
)

func TestHub(t *testing.T) {
	t.Parallel()
	h := New()
	ctx, cancel := context.WithCancel(context.Background())
	a := h.Subscribe(ctx)
	b := h.Subscribe(context.Background())
	h.Notify()
	h.Notify() // coalesced
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		case <-time.After(time.Second):
			t.Fatal("no wake-up")
		}
		select {
		case <-ch:
			t.Fatal("two notifies must coalesce into one value")
		default:
		}
	}
	cancel()
	select {
	case _, ok := <-a:
		if ok {
			t.Fatal("want closed")
		}
	case <-time.After(time.Second):
		t.Fatal("channel not closed after ctx ended")
	}
	if !h.Close() || h.Close() {
		t.Fatal("Close reports whether it closed")
	}
	if _, ok := <-b; ok {
		t.Fatal("Close must close subscribers")
	}
	if _, ok := <-h.Subscribe(context.Background()); ok {
		t.Fatal("subscribing to a closed hub returns a closed channel")
	}
}
