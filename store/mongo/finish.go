package mongo

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
)

var unsetLease = bson.E{Key: "$unset", Value: bson.D{{Key: "claimed_at", Value: ""}, {Key: "claimed_by", Value: ""}}}

// outcome is one fenced update of MessageFinish or MessageRecover and the
// attempt it records when it applies.
type outcome struct {
	filter  bson.D // the fence besides _id
	update  bson.D
	id      string
	attempt *attemptDoc // nil for a release
}

// applyOutcomes runs the updates as one unordered bulk write (see
// updateFenced), each setting the field fop to a token of this call, and
// returns the IDs (with their tenants) of the updates that applied. When
// every update matched, that is all of them, and their tenants come from
// the claims this Store made (read only for the messages it did not
// claim); otherwise the documents still carrying the token are read back.
// Claims never write fop, so a message finished here and claimed again at
// once still counts as applied; only a second finish of it before the
// read-back could hide it (it is then reported as lost, and its attempt is
// not recorded). The attempts of the applied outcomes are added to the
// history in one more write.
func (s *Store) applyOutcomes(ctx context.Context, outs []outcome) (map[string]string, error) {
	if len(outs) == 0 {
		return nil, nil
	}
	op := token()
	ups := make([]fenced, len(outs))
	for i, o := range outs {
		upd := o.update
		for j := range upd {
			if upd[j].Key == "$set" {
				upd[j].Value = append(upd[j].Value.(bson.D), bson.E{Key: "fop", Value: op})
			}
		}
		ups[i] = fenced{id: o.id, filter: o.filter, update: upd}
	}
	matched, err := s.updateFenced(ctx, ups)
	if err != nil {
		return nil, err
	}
	applied := make(map[string]string, len(outs))
	var read bson.A
	if matched == int64(len(outs)) {
		for _, o := range outs {
			if tenant, ok := s.tenants.take(o.id); ok {
				applied[o.id] = tenant
			} else {
				read = append(read, o.id)
			}
		}
	} else {
		for _, o := range outs {
			s.tenants.take(o.id)
			read = append(read, o.id)
		}
	}
	if len(read) > 0 {
		filter := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: read}}}}
		if matched < int64(len(outs)) {
			filter = append(filter, bson.E{Key: "fop", Value: op})
		}
		var got []struct {
			ID     string `bson:"_id"`
			Tenant string `bson:"tenant"`
		}
		cur, err := s.msgs.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "tenant", Value: 1}}))
		if err != nil {
			return nil, err
		}
		if err := cur.All(ctx, &got); err != nil {
			return nil, err
		}
		for _, g := range got {
			applied[g.ID] = g.Tenant
		}
	}
	var atts []any
	for _, o := range outs {
		if tenant, ok := applied[o.id]; ok && o.attempt != nil {
			a := *o.attempt
			a.Tenant = tenant
			atts = append(atts, a)
		}
	}
	if len(atts) > 0 {
		if _, err := s.attempts.InsertMany(ctx, atts); err != nil {
			return applied, fmt.Errorf("attempt history: %w", err)
		}
	}
	return applied, nil
}

// fence is the condition of an outcome or a lease extension besides the
// message's _id: the lease (PROCESSING, owner, attempt, claim token). The
// claim token is the claim's op (see msgDoc.Op); "" matches a lease
// without one (null or missing).
func fence(owner string, attempt int, token string) bson.D {
	var op any
	if token != "" {
		op = token
	}
	return bson.D{
		{Key: "status", Value: string(outbox.StatusProcessing)},
		{Key: "claimed_by", Value: owner}, {Key: "attempts", Value: attempt}, {Key: "op", Value: op},
	}
}

func respText(r json.RawMessage) string { return string(r) }

// MessageFinish implements outbox.Store: the outcomes are written with one
// unordered bulk write, each update fenced by the lease (PROCESSING,
// ClaimedBy = Owner, Attempts = Attempt, op = ClaimToken; see
// updateFenced); when some did
// not match, the applied ones are read back by the token the write set.
// Their attempts are added to the history in one more write. An outcome whose lease was lost changes nothing and its ID is
// returned in LeaseLost. It waits for the lease extensions of p.Owner
// being written through this Store (see lockOwner).
func (s *Store) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	var res outbox.FinishResult
	if err := p.Validate(); err != nil {
		return res, err
	}
	now := s.now(p.Now)
	started := func(t time.Time) time.Time {
		if t.IsZero() {
			return now
		}
		return t.UTC()
	}
	ordered, err := s.orderedOf(ctx, p.Outcomes)
	if err != nil {
		return res, fmt.Errorf("mongo: finish: %w", err)
	}
	outs := make([]outcome, 0, len(p.Outcomes))
	for _, o := range p.Outcomes {
		out := outcome{filter: fence(p.Owner, o.Attempt, o.ClaimToken), id: o.ID}
		var set bson.D
		var next time.Time
		switch o.Kind {
		case outbox.OutcomeSent:
			set = bson.D{{Key: "status", Value: string(outbox.StatusSent)}, {Key: "fin", Value: true},
				{Key: "sent_at", Value: now}, {Key: "updated_at", Value: now}}
			if o.ProviderMessageID != "" {
				set = append(set, bson.E{Key: "prov_id", Value: o.ProviderMessageID})
			}
			out.update = bson.D{{Key: "$set", Value: set}, unsetLease}
		case outbox.OutcomeRetry:
			next = s.now(o.NextAttemptAt)
			set = bson.D{{Key: "status", Value: string(outbox.StatusPending)},
				{Key: "next_at", Value: next}, {Key: "last_error", Value: errOf(o.Error)}, {Key: "updated_at", Value: now}}
			out.update = bson.D{{Key: "$set", Value: set}, unsetLease}
		case outbox.OutcomeDead:
			// A dead letter that holds its group stays among the group's
			// open documents (fin false), where the claim stops.
			blocks := o.BlockGroup && ordered[o.ID]
			set = bson.D{{Key: "status", Value: string(outbox.StatusFailed)}, {Key: "fin", Value: !blocks},
				{Key: "blocks_group", Value: blocks}, {Key: "last_error", Value: errOf(o.Error)}, {Key: "updated_at", Value: now}}
			out.update = bson.D{{Key: "$set", Value: set}, unsetLease}
		case outbox.OutcomeReleased:
			set = bson.D{{Key: "status", Value: string(outbox.StatusPending)}, {Key: "updated_at", Value: now}}
			if !o.NextAttemptAt.IsZero() {
				set = append(set, bson.E{Key: "next_at", Value: s.now(o.NextAttemptAt)})
				if o.Error != nil {
					set = append(set, bson.E{Key: "last_error", Value: errOf(o.Error)})
				}
			}
			out.update = bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: "attempts", Value: -1}}}, unsetLease}
		}
		if kind, ok := o.Kind.AttemptOutcome(); ok {
			out.attempt = &attemptDoc{MsgID: o.ID, N: o.Attempt, Outcome: string(kind), Error: errOf(o.Error),
				Response: respText(o.ProviderResponse), StartedAt: started(o.StartedAt), FinishedAt: now}
			if o.Kind == outbox.OutcomeRetry {
				out.attempt.NextAt = tp(next)
			}
		}
		outs = append(outs, out)
	}
	unlock, err := s.lockOwner(ctx, p.Owner)
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("mongo: finish: %w", err)
	}
	applied, err := s.applyOutcomes(ctx, outs)
	unlock()
	if err != nil {
		return outbox.FinishResult{}, fmt.Errorf("mongo: finish: %w", err)
	}
	for _, o := range outs {
		if _, ok := applied[o.id]; !ok {
			res.LeaseLost = append(res.LeaseLost, o.id)
		}
	}
	if len(applied) > 0 {
		s.Notify() // a finished message may unblock the next one of its group
	}
	return res, nil
}

// leaseExpiredCode is the LastError code of a message whose lease expired.
const leaseExpiredCode = "lease_expired"

// MessageRecover implements outbox.Store: every PROCESSING message claimed
// before p.ClaimedBefore goes back to PENDING (due at once) without its lost
// attempt counted, with one more recovery, or to FAILED when that recovery
// reaches p.MaxRecoveries (outbox.DefaultMaxRecoveries when 0). Both get
// LastError code "lease_expired" and an attempt numbered like the lost
// claim. Each update is fenced by the lease it read (owner, attempt, claim
// token and ClaimedAt), so an outcome recorded meanwhile wins, and so does
// a new lease its owner took meanwhile, after releasing the expired one.
// FerretDB v1.24 does not keep that fence: it reads the documents matching
// an update's filter and then writes each back whole by its _id, checking
// nothing again, so a release and a new claim that came between its read
// and its write were undone (the new lease freed, its message claimable
// twice). The updates are therefore written under the locks of their
// owners (see lockOwner), which the outcomes and lease extensions written
// through this Store take too: a release waits for the recovery's write,
// and a new claim, which follows the release, cannot fall in between. They
// are also written under the claims' lock documents of the messages'
// groups (or of the unordered messages), waiting for a claim that holds
// one: a claim in another process cannot lease a message again before the
// write either. What is still not fenced there is an outcome recorded in
// another process between the read and the write: the recovered document
// overwrites it, and the message, whose lease had expired, is published
// again.
func (s *Store) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	var res outbox.RecoverResult
	if err := p.Validate(); err != nil {
		return res, err
	}
	maxRecoveries := cmp.Or(p.MaxRecoveries, outbox.DefaultMaxRecoveries)
	now := s.now(p.Now)
	var expired []msgDoc
	if err := s.findAll(ctx, bson.D{{Key: "status", Value: string(outbox.StatusProcessing)},
		{Key: "claimed_at", Value: bson.D{{Key: "$lt", Value: p.ClaimedBefore.UTC()}}}}, &expired,
		options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}).SetLimit(10000)); err != nil {
		return res, fmt.Errorf("mongo: recover: %w", err)
	}
	e := &errDoc{Code: leaseExpiredCode, Message: "the lease expired before the outcome was recorded (the processor stopped or stalled)"}
	var outs []outcome
	dead := map[string]bool{}
	for _, d := range expired {
		filter := fence(d.ClaimedBy, d.Attempts, d.Op)
		filter = append(filter, bson.E{Key: "claimed_at", Value: tv(d.ClaimedAt)})
		a := &attemptDoc{MsgID: d.ID, N: d.Attempts, Error: e, StartedAt: tv(d.ClaimedAt), FinishedAt: now}
		// The lost attempt is not counted; the recovery is.
		uncharge := bson.E{Key: "$inc", Value: bson.D{{Key: "attempts", Value: -min(d.Attempts, 1)}, {Key: "recoveries", Value: 1}}}
		if d.Recoveries+1 >= maxRecoveries {
			dead[d.ID] = true
			a.Outcome = string(outbox.AttemptFailed)
			blocks := p.DeadLetter.Blocks(d.Topic, d.Group)
			outs = append(outs, outcome{filter: filter, id: d.ID, attempt: a,
				update: bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: string(outbox.StatusFailed)}, {Key: "fin", Value: !blocks},
					{Key: "blocks_group", Value: blocks}, {Key: "last_error", Value: e}, {Key: "updated_at", Value: now}}}, unsetLease, uncharge}})
			continue
		}
		next := d.NextAt
		if now.Before(next) {
			next = now
		}
		a.Outcome, a.NextAt = string(outbox.AttemptRetry), tp(now)
		outs = append(outs, outcome{filter: filter, id: d.ID, attempt: a,
			update: bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: string(outbox.StatusPending)},
				{Key: "next_at", Value: next}, {Key: "last_error", Value: e}, {Key: "updated_at", Value: now}}}, unsetLease, uncharge}})
	}
	if len(outs) == 0 {
		return res, nil
	}
	// The claims' locks of the messages' groups (or of the unordered
	// messages themselves) keep a claim in any process from leasing one
	// of them again while the recovery writes (see MessageRecover).
	owners := make([]string, 0, len(expired))
	keys := make([]string, 0, len(expired))
	seen := map[string]bool{}
	for _, d := range expired {
		owners = append(owners, d.ClaimedBy)
		k := lockKeyMessage(d.ID)
		if d.GKey != "" {
			k = lockKeyGroup(d.GKey)
		}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	holder := token()
	if err := s.lockWait(ctx, keys, holder); err != nil {
		return outbox.RecoverResult{}, fmt.Errorf("mongo: recover: %w", err)
	}
	defer s.unlock(context.WithoutCancel(ctx), keys, holder)
	unlock, err := s.lockOwners(ctx, owners)
	if err != nil {
		return outbox.RecoverResult{}, fmt.Errorf("mongo: recover: %w", err)
	}
	applied, err := s.applyOutcomes(ctx, outs)
	unlock()
	if err != nil {
		return outbox.RecoverResult{}, fmt.Errorf("mongo: recover: %w", err)
	}
	for id := range applied {
		if dead[id] {
			res.DeadLettered++
		} else {
			res.Recovered++
		}
	}
	if len(applied) > 0 {
		s.Notify()
	}
	return res, nil
}

// orderedOf reports which of the dead letters recorded with BlockGroup
// belong to an ordered group (group "" has no group to hold). It reads
// nothing when none asks to block.
func (s *Store) orderedOf(ctx context.Context, outs []outbox.Outcome) (map[string]bool, error) {
	var ids bson.A
	for _, o := range outs {
		if o.BlockGroup {
			ids = append(ids, o.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	var docs []struct {
		ID   string `bson:"_id"`
		GKey string `bson:"gkey"`
	}
	if err := s.findAll(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, &docs,
		options.Find().SetProjection(bson.D{{Key: "gkey", Value: 1}})); err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(docs))
	for _, d := range docs {
		out[d.ID] = d.GKey != ""
	}
	return out, nil
}
