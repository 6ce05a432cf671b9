package seedcore

import (
	"context"
	"sort"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// claimTimeout bounds a claim once started.
const claimTimeout = 30 * time.Second

// callerDoneKey carries the caller's Done channel into a claim, which runs
// on a context without cancellation: a claim made of several steps
// (MongoDB) stops at the next step once the caller is gone, handing out
// what it leased so far.
type callerDoneKey struct{}

// CallerGone reports whether the caller of the claim running on ctx (a
// context from BeginClaim) has gone.
func CallerGone(ctx context.Context) bool {
	done, _ := ctx.Value(callerDoneKey{}).(<-chan struct{})
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// BeginClaim validates p and returns the context the claim runs on, the
// function that releases it, and the topics of the tables to claim from,
// in this claim's order (the tables take turns to go first; see
// NextTurn).
//
// A claim commits on the server as it goes: if ctx ended while it ran,
// the caller would lose rows the server leased (they would wait for
// recovery). So ctx is checked here, before the claim starts, and the
// claim then runs on a context without ctx's cancellation (bounded by 30
// s) to completion and returns what it leased; the caller releases what it
// will not send. CallerGone tells a claim of several steps that the caller
// has gone.
func (c *Core) BeginClaim(ctx context.Context, p outbox.MessageClaimParams) (context.Context, context.CancelFunc, []string, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, nil, err
	}
	topics, err := c.topicsFor(p.Topics)
	if err != nil || len(topics) == 0 {
		return nil, nil, nil, err
	}
	caller := ctx.Done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	ctx = context.WithValue(ctx, callerDoneKey{}, caller)
	c.mu.Lock()
	first := c.turn % len(topics)
	c.mu.Unlock()
	return ctx, cancel, append(append([]string{}, topics[first:]...), topics[:first]...), nil
}

// NextTurn lets the other table go first next time: a claim calls it when
// its first table alone filled the limit, so neither starves.
func (c *Core) NextTurn() {
	c.mu.Lock()
	c.turn++
	c.mu.Unlock()
}

// Claim is the claim of the SQL stores: one statement (or transaction)
// per table, claim(ctx, topic, limit), the tables taking turns to go
// first, each taking what the limit leaves; rows already claimed when a
// later table fails are handed out. It returns the rows in SortClaimed's
// order.
func (c *Core) Claim(ctx context.Context, p outbox.MessageClaimParams,
	claim func(ctx context.Context, topic string, limit int) ([]outbox.Message, error),
) ([]outbox.Message, error) {
	ctx, cancel, order, err := c.BeginClaim(ctx, p)
	if err != nil || len(order) == 0 {
		return nil, err
	}
	defer cancel()
	var out []outbox.Message
	for i, topic := range order {
		remaining := p.Limit - len(out)
		if remaining == 0 {
			if i == 1 {
				c.NextTurn()
			}
			break
		}
		msgs, err := claim(ctx, topic, remaining)
		if err != nil {
			if len(out) > 0 {
				// Rows already claimed are committed: hand them out.
				c.Log.WarnContext(ctx, "seedstore: claim failed", "table", c.TableName(topic), "err", err)
				break
			}
			return nil, err
		}
		out = append(out, msgs...)
	}
	SortClaimed(out)
	return out, nil
}

// SortClaimed orders claimed messages as a claim returns them: created_at,
// then id (TSIDs follow creation, so this is Seq order for the store's own
// ids), events before dispatch jobs.
func SortClaimed(out []outbox.Message) {
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Topic > out[j].Topic // EVENT before DISPATCH_JOB
	})
}
