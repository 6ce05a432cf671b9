package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/outbox"
)

// Record states in publishPipelined.
const (
	notProduced = iota // never handed to the client
	inFlight           // handed to the client, not resolved
	resolved           // the client called its promise
)

// publishPipelined produces every message of msgs at once, each group's
// records in group order, then maps the results so that a group's first
// failure stops the group. See Publisher, "Pipelined groups".
func (p *Publisher) publishPipelined(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	out := make([]outbox.Result, len(msgs))
	gid := make([]int, len(msgs)) // the message's group number, -1 for an unordered message
	groups := map[string]int{}
	for i := range msgs {
		gid[i] = -1
		if msgs[i].Group != "" {
			k := msgs[i].GroupKey()
			g, ok := groups[k]
			if !ok {
				g = len(groups)
				groups[k] = g
			}
			gid[i] = g
		}
	}
	failed := make([]atomic.Bool, len(groups)) // a record of the group failed (set by its promise)
	stopped := make([]error, len(groups))      // produce no more of the group in this call: why
	inflight := make([]int, len(groups))       // records of the group produced and not yet received from done
	state := make([]uint8, len(msgs))
	done := make(chan produced, len(msgs)) // buffered: a late promise never blocks
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()

	pending := 0
	receive := func(d produced) {
		pending--
		state[d.j] = resolved
		if g := gid[d.j]; g >= 0 {
			inflight[g]--
		}
		if d.err != nil {
			out[d.j].Err = p.classify(ctx, d.err)
			return
		}
		out[d.j] = ackResult(d.rec)
	}
	for i := range msgs {
		g := gid[i]
		if g >= 0 && stopped[g] == nil && failed[g].Load() {
			stopped[g] = errEarlierFailed
		}
		if g >= 0 && stopped[g] != nil {
			out[i].Err = stopped[g]
			continue
		}
		if err := rctx.Err(); err != nil {
			out[i].Err = p.notProducedErr(ctx, err)
			continue
		}
		rec, err := p.record(&msgs[i])
		if err != nil {
			out[i].Err = err
			if g >= 0 {
				stopped[g] = errEarlierFailed
			}
			continue
		}
		// A record that must wait for room (MaxInFlight, or the client's
		// buffer, where Produce would block) waits until its group's
		// earlier records resolved too: a failure among them is then
		// known before it is produced, rather than racing its promise.
		mustWait := pending >= p.maxInFlight || p.bufferFull()
		var waitErr error
		for waitErr == nil && (pending >= p.maxInFlight || mustWait && g >= 0 && inflight[g] > 0) {
			select {
			case d := <-done:
				receive(d)
			case <-rctx.Done():
				waitErr = rctx.Err()
			}
		}
		if waitErr != nil {
			out[i].Err = p.notProducedErr(ctx, waitErr)
			continue
		}
		if g >= 0 && failed[g].Load() { // failed while we waited
			stopped[g] = errEarlierFailed
			out[i].Err = errEarlierFailed
			continue
		}
		pending++
		state[i] = inFlight
		if g >= 0 {
			inflight[g]++
		}
		p.client.Produce(rctx, rec, func(r *kgo.Record, err error) {
			if err != nil && g >= 0 {
				failed[g].Store(true)
			}
			done <- produced{j: i, rec: r, err: err}
		})
		if g >= 0 && userSize(rec) > p.bigRecord {
			// franz-go may fail a record this large alone (too large for
			// a batch): produce the group's later records only after it.
			stopped[g] = errHeldBack
		}
	}

await:
	for pending > 0 {
		select {
		case d := <-done:
			receive(d)
		case <-ctx.Done():
			for i := range msgs {
				if state[i] == inFlight {
					out[i].Err = &outbox.PublishError{Code: "canceled", Message: "the context ended before the broker answered", Err: ctx.Err()}
				}
			}
			break await
		}
	}

	// A group's first failure stands; the client failed the group's later
	// buffered records with it (nothing behind a failed batch of a partition
	// is written), so they were not attempted. A later record that was
	// written after an earlier one failed retryably is an order violation:
	// reported as sent, since it was.
	first := make([]int, len(groups))
	for g := range first {
		first[g] = -1
	}
	for i := range msgs {
		g := gid[i]
		if g < 0 {
			continue
		}
		f := first[g]
		if f < 0 {
			if out[i].Err != nil {
				first[g] = i
			}
			continue
		}
		switch {
		case out[i].Err == nil:
			if state[f] == resolved && outbox.IsRetryable(out[f].Err) {
				p.violations.Add(1)
			}
		case state[i] == resolved:
			out[i].Err = fmt.Errorf("%w: an earlier message of the group failed: %w", outbox.ErrNotAttempted, out[i].Err)
		case state[i] == notProduced && !errors.Is(out[i].Err, outbox.ErrNotAttempted):
			out[i].Err = errEarlierFailed // e.g. its topic failed too: the first failure decides
		}
	}
	return out
}

var (
	errEarlierFailed = fmt.Errorf("%w: an earlier message of the group failed", outbox.ErrNotAttempted)
	errHeldBack      = fmt.Errorf("%w: held back behind a large earlier message of the group", outbox.ErrNotAttempted)
)

// bufferFull reports whether the client holds the most records it may
// buffer, so that Produce would block.
func (p *Publisher) bufferFull() bool {
	cl, ok := p.client.(*kgo.Client)
	return ok && p.maxBuffered > 0 && cl.BufferedProduceRecords() >= p.maxBuffered
}

// userSize is the size franz-go accounts a record at: key, value and
// headers.
func userSize(r *kgo.Record) int64 {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// notProducedErr is the error of a message not produced because the delivery
// context ended (err): ErrNotAttempted, joined with the Publish context's
// error when that ended.
func (p *Publisher) notProducedErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.Join(outbox.ErrNotAttempted, ctx.Err())
	}
	return fmt.Errorf("%w: not produced within %s: %w", outbox.ErrNotAttempted, p.timeout, err)
}
