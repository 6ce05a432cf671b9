package mysql

import (
	"context"
	"errors"
	"time"

	"github.com/go-sql-driver/mysql"
)

// retries is how many times a claim or an outcome write is run again
// after the server chose its transaction as a deadlock victim (error 1213)
// or one of its lock waits timed out (1205). Either way the transaction is
// rolled back whole (the store rolls back after a failed statement), so
// nothing of it was applied and running it again is safe.
const retries = 5

// retry runs fn, and again after a deadlock or a lock wait timeout, up to
// retries times, with a short growing pause between tries.
func retry[T any](ctx context.Context, s *Store, op string, fn func() (T, error)) (T, error) {
	for try := 0; ; try++ {
		v, err := fn()
		if err == nil || !retryable(err) || try >= retries {
			return v, err
		}
		s.core.Log.DebugContext(ctx, "seedstore: retrying a MySQL transaction", "op", op, "err", err, "try", try+1)
		t := time.NewTimer(time.Duration(try+1) * 5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// retryable reports a deadlock (1213) or a lock wait timeout (1205).
func retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}
