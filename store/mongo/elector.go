package mongo

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxkit/outboxkit/internal/elect"
	"github.com/outboxkit/outboxkit/internal/surface"
	"github.com/outboxkit/outboxkit/outbox"
)

// Every store offers an Elector of the same shape.
var (
	_ surface.Elector                            = (*Elector)(nil)
	_ surface.Electing[ElectorOptions, *Elector] = (*Store)(nil)
)

// ElectorOptions configures an Elector. The zero value is valid.
type ElectorOptions struct {
	// Name tells independent elections on one outbox apart (one per
	// processor role). Defaults to "processor".
	Name string
	// RetryInterval is how often a follower tries to become leader.
	// Defaults to 5 s.
	RetryInterval time.Duration
	// CheckInterval is how often the leader renews its lease; a renewal
	// that finds the lease taken ends its leadership at once. Defaults to
	// 2 s.
	CheckInterval time.Duration
	// LeaseTTL is how long the lease lasts after its last renewal, by the
	// server's clock: a leader that dies without releasing it is replaced
	// within LeaseTTL + RetryInterval. It must be more than twice
	// CheckInterval. Defaults to 15 s.
	LeaseTTL time.Duration
}

// Elector elects one leader among the replicas that run it on the same
// outbox (seed 004's "primary only" mode). MongoDB has no lock that lives
// as long as a session, so the leader holds a lease: a document of the
// store's locks collection,
//
//	{_id: "elector:<name>", owner, epoch, expires_at}
//
// Taking a free lease is one insert (the unique _id lets one of several
// replicas in), after a lease that has expired by the server's clock is
// deleted (only as it was read: same owner, same epoch, still expired).
// The owner names the Elector (random, one per Elector); the epoch is 1
// for a lease taken free and one more than the expired lease's when taken
// over, so it counts the leaders that lost their lease without releasing
// it. The leader renews the lease every CheckInterval with an update
// fenced by its owner and epoch, and stops leading as soon as a renewal
// matches nothing (another replica took over) or when it has not renewed
// for LeaseTTL - CheckInterval (measured from before its last successful
// renewal began), before the lease can lapse. Stopping deletes the lease
// (fenced the same way), so a follower takes over within its
// RetryInterval.
//
//	el := store.Elector(mongo.ElectorOptions{})
//	err := el.Run(ctx, func(ctx context.Context) {
//		_ = processor.Run(ctx) // claims only while this replica leads
//	})
//
// Exclusivity rests on the clocks of the server and the leader running at
// the same rate within CheckInterval per LeaseTTL. On FerretDB, whose
// updates read a document and write it back, a renewal racing a takeover
// at the very end of a lease can leave two replicas leading until the
// next renewal, within CheckInterval. That is safe: the claim keeps FIFO
// per group with any number of processors; single-active mode is for
// users who want one active processor, not a correctness requirement.
type Elector struct {
	s      *Store
	opts   ElectorOptions
	id     string // the lease document's _id
	owner  string // this Elector, in the lease document
	leader atomic.Bool
}

// leaseDoc is an Elector's lease document.
type leaseDoc struct {
	ID      string    `bson:"_id"`
	Owner   string    `bson:"owner"`
	Epoch   int64     `bson:"epoch"`
	Expires time.Time `bson:"expires_at"`
}

// term is one leadership of an Elector: its epoch and when it must stop
// leading unless it renews the lease (by the local monotonic clock).
type term struct {
	epoch    int64
	deadline time.Time
}

// Elector returns an Elector for this store's outbox.
func (s *Store) Elector(opts ElectorOptions) *Elector {
	elect.Default(&opts.Name, &opts.RetryInterval, &opts.CheckInterval)
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 15 * time.Second
	}
	return &Elector{s: s, opts: opts, id: "elector:" + opts.Name, owner: token()}
}

// IsLeader reports whether this Elector holds the leadership now.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Run campaigns until ctx ends. Each time this replica becomes leader it
// calls lead with a context that is cancelled when leadership ends (ctx
// ended, the lease was taken, or it could not be renewed in time), waits
// for lead to return, and deletes the lease; if lead returns on its own,
// Run releases the lease and campaigns again. A nil lead just holds the
// leadership while it lasts, for use with outbox.Config.Leader:
//
//	el := store.Elector(mongo.ElectorOptions{})
//	go el.Run(ctx, nil)
//	p, err := outbox.NewProcessor(store, router, outbox.Config{Leader: el})
//
// Run returns nil when ctx ends, or an error at once when LeaseTTL is not
// more than twice CheckInterval. It logs a database that cannot be reached
// and tries again after RetryInterval.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	if e.opts.LeaseTTL <= 2*e.opts.CheckInterval {
		return outbox.InvalidParam("ElectorOptions.LeaseTTL", fmt.Sprintf("is %s: it must be more than twice CheckInterval (%s)", e.opts.LeaseTTL, e.opts.CheckInterval))
	}
	if lead == nil {
		lead = elect.Hold
	}
	for ctx.Err() == nil {
		t, ok, err := e.acquire(ctx)
		if err != nil && ctx.Err() == nil {
			e.s.log.WarnContext(ctx, "outboxkit/mongo: elector cannot reach the database", "err", err)
		}
		if ok {
			e.lead(ctx, t, lead)
			continue
		}
		if !elect.Sleep(ctx, e.opts.RetryInterval) {
			return nil
		}
	}
	return nil
}

// serverNow returns the server's clock (hello's localTime).
func (e *Elector) serverNow(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := e.s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, err
	}
	if hello.LocalTime.IsZero() {
		return time.Now().UTC(), nil
	}
	return hello.LocalTime.UTC(), nil
}

// acquire takes the lease when it is free or expired.
func (e *Elector) acquire(ctx context.Context) (term, bool, error) {
	began := time.Now()
	now, err := e.serverNow(ctx)
	if err != nil {
		return term{}, false, err
	}
	var cur leaseDoc
	err = e.s.locks.FindOne(ctx, bson.D{{Key: "_id", Value: e.id}}).Decode(&cur)
	expired := err == nil
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
	case err != nil:
		return term{}, false, err
	case cur.Expires.After(now):
		return term{}, false, nil
	}
	// The writes run to their end even when ctx ends meanwhile: a write
	// abandoned in flight may still land after the release below, leaving
	// a lease nobody holds until it expires. ctx ending is seen by Run,
	// which releases a lease taken here at once.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
	defer cancel()
	epoch := int64(1)
	if expired {
		// Delete the expired lease only as it was read: if another
		// replica took it over meanwhile, nothing is deleted and the
		// insert below fails.
		if _, err := e.s.locks.DeleteOne(wctx, bson.D{{Key: "_id", Value: e.id}, {Key: "owner", Value: cur.Owner},
			{Key: "epoch", Value: cur.Epoch}, {Key: "expires_at", Value: bson.D{{Key: "$lte", Value: now}}}}); err != nil {
			return term{}, false, err
		}
		epoch = cur.Epoch + 1
	}
	_, err = e.s.locks.InsertOne(wctx, leaseDoc{ID: e.id, Owner: e.owner, Epoch: epoch, Expires: now.Add(e.opts.LeaseTTL)})
	if mongo.IsDuplicateKeyError(err) {
		return term{}, false, nil
	}
	if err != nil {
		// The insert may have been written all the same (the connection
		// broke after it was sent): let it go.
		e.release(ctx, epoch)
		return term{}, false, err
	}
	return term{epoch: epoch, deadline: e.deadline(began)}, true, nil
}

// deadline is when a term whose lease was written after began must end
// unless renewed: the lease cannot expire before began + LeaseTTL by the
// server's clock; CheckInterval is the margin.
func (e *Elector) deadline(began time.Time) time.Time {
	return began.Add(e.opts.LeaseTTL - e.opts.CheckInterval)
}

// fence selects this Elector's lease of epoch.
func (e *Elector) fence(epoch int64) bson.D {
	return bson.D{{Key: "_id", Value: e.id}, {Key: "owner", Value: e.owner}, {Key: "epoch", Value: epoch}}
}

// errLeaseTaken is a renewal that found another replica's lease.
var errLeaseTaken = errors.New("another replica took the lease")

// renew extends t's lease and returns its new deadline. It gives up at t's
// deadline.
func (e *Elector) renew(ctx context.Context, t term) (time.Time, error) {
	ctx, cancel := context.WithDeadline(ctx, t.deadline)
	defer cancel()
	began := time.Now()
	now, err := e.serverNow(ctx)
	if err != nil {
		return t.deadline, err
	}
	res, err := e.s.locks.UpdateOne(ctx, e.fence(t.epoch),
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: now.Add(e.opts.LeaseTTL)}}}})
	if err != nil {
		return t.deadline, err
	}
	if res.MatchedCount == 0 {
		return t.deadline, errLeaseTaken
	}
	return e.deadline(began), nil
}

// lead runs the leader's term t: it renews the lease every CheckInterval
// until ctx ends, lead returns, the lease is lost or could not be renewed
// before t's deadline, then releases it.
func (e *Elector) lead(ctx context.Context, t term, lead func(ctx context.Context)) {
	err := elect.Term{
		Leader: &e.leader, Log: e.s.log, Prefix: "outboxkit/mongo", Attrs: []any{"election", e.opts.Name, "epoch", t.epoch},
		Every: e.opts.CheckInterval,
		Check: func(ctx context.Context) error {
			deadline, err := e.renew(ctx, t)
			switch {
			case errors.Is(err, errLeaseTaken):
				e.s.log.WarnContext(ctx, "outboxkit/mongo: leader lost its lease, stepping down", "election", e.opts.Name)
				return err
			case err != nil:
				if ctx.Err() == nil {
					e.s.log.WarnContext(ctx, "outboxkit/mongo: leader could not renew its lease", "err", err)
				}
			default:
				t.deadline = deadline
			}
			return nil
		},
		Deadline: func() time.Time { return t.deadline },
	}.Run(ctx, lead)
	// Released whenever the lease may still be this Elector's, also after
	// a term that lapsed: a renewal whose answer came too late may have
	// extended it. The fence (owner, epoch) leaves a lease another replica
	// took untouched.
	if !errors.Is(err, errLeaseTaken) {
		e.release(ctx, t.epoch)
	}
}

// leaseWriteTimeout bounds an Elector's writes that run on after their
// context ended: taking the lease, and releasing it.
const leaseWriteTimeout = 5 * time.Second

// release deletes this Elector's lease of epoch. A failure is logged; the
// lease then expires after LeaseTTL.
func (e *Elector) release(ctx context.Context, epoch int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
	defer cancel()
	if _, err := e.s.locks.DeleteOne(ctx, e.fence(epoch)); err != nil {
		e.s.log.WarnContext(ctx, "outboxkit/mongo: could not release the lease; it expires after LeaseTTL", "err", err)
	}
}
