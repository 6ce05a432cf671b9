package mongo_test

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// TestLeaseWithoutClaimToken: a message leased without a claim token (no
// op: a claim before ops were written leaves none) is extended, finished
// and recovered as storetest.LeaseWithoutClaimToken says.
func TestLeaseWithoutClaimToken(t *testing.T) {
	t.Parallel()
	st, db := newStore(t, mongo.Options{})
	storetest.LeaseWithoutClaimToken[context.Context](t, st, func(ctx context.Context) error {
		_, err := db.DB.Collection("outbox_messages").UpdateMany(ctx, bson.D{},
			bson.D{{Key: "$unset", Value: bson.D{{Key: "op", Value: ""}}}})
		return err
	})
}
