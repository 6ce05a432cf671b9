package surface

import (
	"context"

	"github.com/outboxkit/outboxkit/outbox"
)

// Elector is what every store's Elector offers: IsLeader, so it can be an
// outbox.Config.Leader, and Run, which campaigns until its context ends
// and calls lead for each term this replica leads.
type Elector interface {
	outbox.Leader
	// Run campaigns until ctx ends, calling lead (when not nil) with a
	// context that ends with the term; it returns nil when ctx ends.
	Run(ctx context.Context, lead func(ctx context.Context)) error
}

// Electing is a store that elects a leader among the replicas running on
// its database: Elector(opts) returns an E configured by the store's
// ElectorOptions O. Every store checks it at compile time:
//
//	var _ surface.Electing[ElectorOptions, *Elector] = (*Store)(nil)
type Electing[O any, E Elector] interface {
	Elector(opts O) E
}
