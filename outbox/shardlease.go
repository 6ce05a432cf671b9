package outbox

import (
	"context"
	"time"
)

// ShardLeaser is the coordination store of a Fleet: the instances of a fleet
// record there that they are alive (members) and which of them serves which
// shard (leases). store/postgres implements it in a small table of one
// PostgreSQL database; outside implementations are welcome.
//
// A lease is held by one member until it expires (TTL after it was taken or
// last renewed, by the coordination store's clock) or is released; each
// acquisition raises the shard's Epoch, so leases of one shard are totally
// ordered. Methods are listed alphabetically.
type ShardLeaser interface {
	// ShardAcquire takes, for p.Member, every shard of p.Shards that has no
	// lease or whose lease expired or was released, for p.TTL, and returns
	// the leases it took (each with a new, higher Epoch). A shard held by a
	// live lease is left alone.
	ShardAcquire(ctx context.Context, p ShardAcquireParams) ([]ShardLease, error)
	// ShardList returns the lease of every shard that has one, live or
	// expired (Expired says which).
	ShardList(ctx context.Context, p ShardListParams) ([]ShardLease, error)
	// ShardMembers records that p.Member is alive for p.TTL (or, with
	// p.Leave, that it left) and returns the live members, p.Member
	// included unless it left, sorted.
	ShardMembers(ctx context.Context, p ShardMembersParams) ([]string, error)
	// ShardRelease ends p.Member's leases on p.Shards at once, so another
	// member may take them without waiting for them to expire.
	ShardRelease(ctx context.Context, p ShardReleaseParams) error
	// ShardRenew extends for p.TTL the leases p.Member still holds on
	// p.Shards (live, not released) and returns them; a shard missing from
	// the result is no longer p.Member's.
	ShardRenew(ctx context.Context, p ShardRenewParams) ([]ShardLease, error)
}

// ShardLease is one shard's lease.
type ShardLease struct {
	// Shard names the shard (a database, for a Fleet).
	Shard string
	// Owner is the member that holds or last held the lease.
	Owner string
	// Epoch counts the acquisitions of the shard: a lease with a higher
	// Epoch was taken after every lease with a lower one ended.
	Epoch int64
	// Expired reports that the lease ran out or was released.
	Expired bool
	// ExpiresAt is when the lease runs out unless renewed, by the
	// coordination store's clock; zero when it was released, or when the
	// ShardLeaser does not tell (it is for operators: the fleet decides by
	// Expired).
	ExpiresAt time.Time
}

// ShardAcquireParams names the shards a member tries to take.
type ShardAcquireParams struct {
	Member string
	Shards []string
	TTL    time.Duration
}

// ShardListParams is empty; it is a struct so fields can be added.
type ShardListParams struct{}

// ShardMembersParams records a member's heartbeat, or its leaving.
type ShardMembersParams struct {
	Member string
	TTL    time.Duration
	// Leave removes Member from the members at once (a clean shutdown),
	// so the others take its share without waiting for TTL.
	Leave bool
}

// ShardReleaseParams names the shards a member gives up.
type ShardReleaseParams struct {
	Member string
	Shards []string
}

// ShardRenewParams names the shards whose leases a member extends.
type ShardRenewParams struct {
	Member string
	Shards []string
	TTL    time.Duration
}

type shardCtxKey struct{}

// ShardFromContext returns the shard lease under which a Fleet's processor
// runs, from the context the Fleet's processors pass to Publisher.Publish
// (and to every store call): a publisher shared by every shard can tell
// which database a batch comes from, and with Epoch order the leases of
// one database.
func ShardFromContext(ctx context.Context) (ShardLease, bool) {
	l, ok := ctx.Value(shardCtxKey{}).(ShardLease)
	return l, ok
}
