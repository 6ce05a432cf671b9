package mongo

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Wakeups implements outbox.Waker. The channel receives a value soon after
// this process enqueues, finishes or requeues a message (Notify), and,
// where the server has change streams (a replica set or sharded cluster),
// soon after any process inserts a message or makes one PENDING again,
// including inside a transaction, once it commits. Without change streams
// other processes' messages wait for the poll interval. Bursts are
// coalesced; the channel is closed when ctx ends or the Store is closed.
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} {
	hub := s.wake.Subscribe(ctx)
	if s.opts.DisableChangeStreams {
		return hub
	}
	out := make(chan struct{}, 1)
	events := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(ctx)
	go s.watch(wctx, events)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case _, ok := <-hub:
				if !ok {
					return
				}
				signal(out)
			case <-events:
				signal(out)
			}
		}
	}()
	return out
}

func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// watch follows a change stream of the messages collection until ctx ends.
// When the server has none it logs once and returns.
func (s *Store) watch(ctx context.Context, events chan<- struct{}) {
	pipe := mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "operationType", Value: "insert"}},
		bson.D{{Key: "updateDescription.updatedFields.status", Value: "PENDING"}},
	}}}}}}
	pause := time.Second
	for ctx.Err() == nil {
		cs, err := s.msgs.Watch(ctx, pipe)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Info("mongo: no change streams on this server; wake-ups come from this process and the poll interval", "error", err)
			}
			return
		}
		signal(events) // anything committed while no stream was open
		for cs.Next(ctx) {
			signal(events)
		}
		err = cs.Err()
		_ = cs.Close(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("mongo: change stream ended; reopening", "error", err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
