package mongo

import (
	"context"
	"errors"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
)

// idFilter matches the documents with one of ids: each as a string and,
// when it is the hex form of an ObjectId, as that ObjectId.
func idFilter(ids []string) bson.D {
	if len(ids) == 1 {
		if _, err := bson.ObjectIDFromHex(ids[0]); err != nil {
			return bson.D{{Key: "_id", Value: ids[0]}}
		}
	}
	in := make(bson.A, 0, len(ids))
	for _, id := range ids {
		in = append(in, id)
		if len(id) == 24 {
			if oid, err := bson.ObjectIDFromHex(id); err == nil {
				in = append(in, oid)
			}
		}
	}
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}
}

// decodeRow decodes a seed document leniently: the seed's types, plus what
// other clients commonly write (ObjectId ids, numbers of any width,
// embedded payload documents, RFC 3339 strings for dates).
func decodeRow(raw bson.Raw) (seedcore.Row, error) {
	var r seedcore.Row
	idv, err := raw.LookupErr("_id")
	if err != nil {
		return r, errors.New("document without _id")
	}
	switch idv.Type {
	case bson.TypeString:
		r.ID = idv.StringValue()
	case bson.TypeObjectID:
		r.ID = idv.ObjectID().Hex()
	default:
		r.ID = idv.String()
	}
	str := func(key string) (string, bool) {
		v, err := raw.LookupErr(key)
		if err != nil || v.Type == bson.TypeNull || v.Type == bson.TypeUndefined {
			return "", false
		}
		if s, ok := v.StringValueOK(); ok {
			return s, true
		}
		return v.String(), true
	}
	date := func(key string) (time.Time, bool) {
		v, err := raw.LookupErr(key)
		if err != nil {
			return time.Time{}, false
		}
		switch v.Type {
		case bson.TypeDateTime:
			return time.UnixMilli(v.DateTime()).UTC(), true
		case bson.TypeTimestamp:
			sec, _ := v.Timestamp()
			return time.Unix(int64(sec), 0).UTC(), true
		case bson.TypeString:
			t, err := time.Parse(time.RFC3339Nano, v.StringValue())
			return t.UTC(), err == nil
		}
		return time.Time{}, false
	}
	r.Type, _ = str("type")
	if g, ok := str("messageGroup"); ok {
		r.Group.String, r.Group.Valid = g, true
	}
	if v, err := raw.LookupErr("payload"); err == nil {
		switch v.Type {
		case bson.TypeString:
			r.Payload = v.StringValue()
		case bson.TypeEmbeddedDocument, bson.TypeArray:
			// Relaxed extended JSON is plain JSON for the usual values.
			var x any
			if err := bson.UnmarshalValue(v.Type, v.Value, &x); err == nil {
				if b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: x}}, false, false); err == nil {
					r.Payload = string(b[len(`{"v":`) : len(b)-1])
				}
			}
		}
	}
	r.Status, _ = str("status")
	if v, err := raw.LookupErr("retryCount"); err == nil {
		if n, ok := v.AsInt64OK(); ok && n >= 0 && n <= math.MaxInt32 {
			r.RetryCount = int(n)
		} else if f, ok := v.DoubleOK(); ok && f >= 0 && f <= math.MaxInt32 {
			r.RetryCount = int(f)
		}
	}
	r.CreatedAt, _ = date("createdAt")
	if t, ok := date("processedAt"); ok {
		r.ProcessedAt.Time, r.ProcessedAt.Valid = t, true
	}
	if e, ok := str("errorMessage"); ok {
		r.ErrorMessage.String, r.ErrorMessage.Valid = e, true
	}
	return r, nil
}

func findRows(ctx context.Context, c *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) ([]seedcore.Row, error) {
	opts = append([]options.Lister[options.FindOptions]{options.Find().SetBatchSize(10000)}, opts...)
	cur, err := c.Find(ctx, filter, opts...)
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	var out []seedcore.Row
	for cur.Next(ctx) {
		r, err := decodeRow(cur.Current)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, cur.Err()
}

// byOrder is the order of a group: createdAt, then _id.
var byOrder = bson.D{{Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}

// groupFilter matches the documents of group g (nil: null or missing).
func groupFilter(g *string) bson.E {
	if g == nil {
		return bson.E{Key: "messageGroup", Value: nil}
	}
	return bson.E{Key: "messageGroup", Value: *g}
}
