package sqlite_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/outboxkit/outboxkit/outbox/outboxtest/storetest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// TestLeaseWithoutClaimToken: a message leased before migration 7 (no
// claim token, as a claim of an earlier version leaves it) is extended,
// finished and recovered as storetest.LeaseWithoutClaimToken says.
func TestLeaseWithoutClaimToken(t *testing.T) {
	t.Parallel()
	st := newStore(t, sqlite.Options{})
	storetest.LeaseWithoutClaimToken[*sql.Tx](t, st, func(ctx context.Context) error {
		_, err := st.DB().ExecContext(ctx, `UPDATE outbox_messages SET claim_token = NULL`)
		return err
	})
}
