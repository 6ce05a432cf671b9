package mongo

import (
	"context"
	"errors"
	"sort"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// groupWindow bounds the PENDING and PROCESSING documents one claim
// reads to find groups: per limit item, at most this many index entries.
const groupWindow = 4

// groups returns groups of t with PENDING documents and none
// PROCESSING seen, in turn: the null group first (if it has any), then the
// named groups after last by name, wrapping around. It reads at most window
// PENDING and PROCESSING documents' group and status, in the order of the
// seed's index within each status (groups, then createdAt), so its cost
// does not grow with the backlog; a group with a PROCESSING document among
// them is in flight and left out (claimGroup checks again under the lock).
//
// While the unfinished documents fit in the window (fit: the last claim saw
// them all), and on the first turn (last nil), that is one read from the
// start (null first), rotated here. Otherwise it reads the named groups
// after last (and, at the end, from the start again) and asks whether the
// null group has any.
func (s *Store) groups(ctx context.Context, t *table, last *string, fit bool, window int) ([]*string, error) {
	busy := map[string]bool{}
	null, nullBusy := false, false
	// scan reads up to window entries with messageGroup matching bound
	// (nil: any, null included) and reports whether it saw them all.
	scan := func(bound any) ([]string, bool, error) {
		filter := bson.D{{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{StatusPending, StatusProcessing}}}}}
		if bound != nil {
			filter = append(filter, bson.E{Key: "messageGroup", Value: bound})
		}
		cur, err := t.coll.Find(ctx, filter,
			options.Find().SetSort(bson.D{{Key: "messageGroup", Value: 1}, {Key: "createdAt", Value: 1}}).
				SetProjection(bson.D{{Key: "_id", Value: 0}, {Key: "messageGroup", Value: 1}, {Key: "status", Value: 1}}).
				SetLimit(int64(window)).SetBatchSize(int32(min(window, 10000))))
		if err != nil {
			return nil, false, err
		}
		defer cur.Close(ctx)
		var out []string
		n := 0
		for cur.Next(ctx) {
			n++
			inFlight := false
			if st, _ := cur.Current.Lookup("status").StringValueOK(); st == StatusProcessing {
				inFlight = true
			}
			g, ok := cur.Current.Lookup("messageGroup").StringValueOK()
			if !ok {
				null = null || !inFlight
				nullBusy = nullBusy || inFlight
				continue
			}
			busy[g] = busy[g] || inFlight
			if len(out) == 0 || out[len(out)-1] != g {
				out = append(out, g)
			}
		}
		return out, n < window, cur.Err()
	}
	var named []string
	fits, done, nullKnown := false, false, false
	if last == nil || fit {
		all, complete, err := scan(nil)
		if err != nil {
			return nil, err
		}
		// The null group sorts first: this read saw it if it has any.
		nullKnown = true
		switch {
		case complete:
			fits, done = true, true
			// Rotate: the groups after last, then the rest.
			from := 0
			if last != nil {
				from = sort.SearchStrings(all, *last)
				if from < len(all) && all[from] == *last {
					from++
				}
			}
			named = append(all[from:len(all):len(all)], all[:from]...)
		case last == nil && len(all) > 0:
			// The first turn: the groups from the start.
			named, done = all, true
		}
	}
	if !done {
		clear(busy)
		// Every string is $gte "": the first turn starts at the empty group.
		var bound bson.D
		if last == nil {
			bound = bson.D{{Key: "$gte", Value: ""}}
		} else {
			bound = bson.D{{Key: "$gt", Value: *last}}
		}
		var complete bool
		var err error
		if named, complete, err = scan(bound); err != nil {
			return nil, err
		}
		if last != nil && complete {
			// Wrap around.
			more, _, err := scan(bson.D{{Key: "$lte", Value: *last}})
			if err != nil {
				return nil, err
			}
			named = append(named, more...)
		}
		// The sort puts null first, but the string bound leaves it out:
		// ask. A null group in flight is found under the lock.
		if !s.core.UnorderedNull && !nullKnown {
			err := t.coll.FindOne(ctx, bson.D{{Key: "status", Value: StatusPending}, {Key: "messageGroup", Value: nil}},
				options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
			switch {
			case err == nil:
				null = true
			case !errors.Is(err, mongo.ErrNoDocuments):
				return nil, err
			}
		}
	}
	s.mu.Lock()
	t.groupsFit = fits
	s.mu.Unlock()
	var out []*string
	if !s.core.UnorderedNull && null && !nullBusy {
		out = append(out, nil)
	}
	seen := map[string]bool{}
	for i := range named {
		if g := named[i]; !busy[g] && !seen[g] {
			seen[g] = true
			out = append(out, &named[i])
		}
	}
	return out, nil
}
