package outbox

import (
	"context"
	"errors"
	"fmt"
)

// PublishEach returns a Publisher that publishes a batch one message at a
// time with send, keeping the Publisher contract: when a message of an
// ordered group fails, the group's later messages in the batch are not sent
// (ErrNotAttempted), so FIFO holds; when ctx ends, the rest are not sent
// (ErrNotAttempted joined with ctx.Err()).
// Use it for providers without a batch API.
func PublishEach(send func(ctx context.Context, m Message) Result) Publisher {
	return PublisherFunc(func(ctx context.Context, msgs []Message) []Result {
		out := make([]Result, len(msgs))
		var stopped map[string]bool
		for i := range msgs {
			m := msgs[i]
			if err := ctx.Err(); err != nil {
				out[i] = Result{Err: errors.Join(ErrNotAttempted, err)}
				continue
			}
			if m.Group != "" && stopped[m.GroupKey()] {
				out[i] = Result{Err: ErrNotAttempted}
				continue
			}
			out[i] = send(ctx, m)
			if out[i].Err != nil && m.Group != "" {
				if stopped == nil {
					stopped = map[string]bool{}
				}
				stopped[m.GroupKey()] = true
			}
		}
		return out
	})
}

// PublishWaves drives a publisher that sends several messages at once
// (asynchronous acks) while keeping FIFO per group. Wave k holds the k-th
// message of every ordered group in msgs, and wave 0 also every unordered
// message, each in batch order; waves are sent one after another, in chunks
// of at most chunk messages, each chunk by one call to send, which fills
// out[i] for every index i it is given. When a message of an ordered group
// fails, the group's later messages are not sent (ErrNotAttempted). It
// returns out.
func PublishWaves(ctx context.Context, msgs []Message, chunk int, send func(ctx context.Context, idx []int, out []Result)) []Result {
	out := make([]Result, len(msgs))
	chunk = max(chunk, 1)
	blocked := map[string]bool{}
	for _, wave := range waves(msgs) {
		for len(wave) > 0 {
			var idx []int
			for len(wave) > 0 && len(idx) < chunk {
				i := wave[0]
				wave = wave[1:]
				if msgs[i].Group != "" && blocked[msgs[i].GroupKey()] {
					out[i].Err = fmt.Errorf("%w: an earlier message of the group failed", ErrNotAttempted)
					continue
				}
				idx = append(idx, i)
			}
			if len(idx) == 0 {
				continue
			}
			send(ctx, idx, out)
			for _, i := range idx {
				if out[i].Err != nil && msgs[i].Group != "" {
					blocked[msgs[i].GroupKey()] = true
				}
			}
		}
	}
	return out
}

// waves orders a batch for publishing: wave k holds the k-th message of
// every ordered group, and wave 0 also every unordered message, each in
// batch order.
func waves(msgs []Message) [][]int {
	var ws [][]int
	pos := map[string]int{}
	for i := range msgs {
		k := 0
		if msgs[i].Group != "" {
			key := msgs[i].GroupKey()
			k = pos[key]
			pos[key] = k + 1
		}
		if k == len(ws) {
			ws = append(ws, nil)
		}
		ws[k] = append(ws[k], i)
	}
	return ws
}

// CodeNotJSON is the error code of RequireJSON: a publisher that sends JSON
// only was given a message whose content type is not JSON.
const CodeNotJSON = "payload_not_json"

// RequireJSON returns nil when m's payload is JSON (Message.IsJSON), else a
// permanent publish error with code CodeNotJSON naming the content type.
// Publishers whose destination takes JSON only (WhatsApp, FlowCatalyst)
// call it first, so a protobuf or binary message routed to them is
// dead-lettered at once with a clear reason instead of being sent.
func RequireJSON(m *Message) error {
	if m.IsJSON() {
		return nil
	}
	return Permanent(CodeNotJSON, fmt.Sprintf("content type %q is not JSON; this publisher sends JSON payloads only", m.ContentType))
}
