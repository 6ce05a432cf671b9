package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outboxkit/internal/elect"
	"github.com/outboxkit/outboxkit/internal/surface"
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
	// CheckInterval is how often the leader checks that its connection
	// still holds the lock; a failed check ends its leadership at once. A
	// check waits for the server up to CheckInterval or 5 s, whichever is
	// longer, so that a slow moment does not end the leadership (a check
	// cut off closes the connection, and with it the lock). Defaults to
	// 2 s.
	CheckInterval time.Duration
}

// Elector elects one leader among the replicas that run it on the same
// outbox (seed 004's "primary only" mode). The leader holds a user-level
// lock, GET_LOCK, on a dedicated connection taken out of the store's
// database and closed after use; when its process dies or its connection
// breaks, the server releases the lock and a follower takes over within
// its RetryInterval.
//
//	el := store.Elector(mysql.ElectorOptions{})
//	err := el.Run(ctx, func(ctx context.Context) {
//		_ = processor.Run(ctx) // claims only while this replica leads
//	})
//
// The lock is named after the database, the store's table prefix and
// ElectorOptions.Name, "outboxkit:<database>.<prefix>messages:<name>",
// or, when that is longer than the 64 characters GET_LOCK allows,
// "outboxkit:" followed by 40 hex digits of its SHA-256. Lock names are
// global to the server, so the database is part of the name. Operators
// see the holder with SELECT IS_USED_LOCK(name).
//
// Leadership is exclusive as far as the server can tell; once the server
// has ended the leader's session (a restart, KILL, a network split it
// noticed), the old leader stops within CheckInterval (its check of the
// lock fails), or within its check's timeout when the server does not
// answer, so for that long two replicas may claim at once. That is safe:
// the claim keeps FIFO per group with any number of processors;
// single-active mode is for users who want one active processor, not a
// correctness requirement.
type Elector struct {
	d      *dialect
	opts   ElectorOptions
	leader atomic.Bool
}

// Elector returns an Elector for this store's outbox.
func (s *Store) Elector(opts ElectorOptions) *Elector {
	elect.Default(&opts.Name, &opts.RetryInterval, &opts.CheckInterval)
	return &Elector{d: s.d, opts: opts}
}

// IsLeader reports whether this Elector holds the leadership now.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Run campaigns until ctx ends. Each time this replica becomes leader it
// calls lead with a context that is cancelled when leadership ends (ctx
// ended or the lock's connection failed), waits for lead to return, and
// releases the lock; if lead returns on its own, Run releases the lock and
// campaigns again. A nil lead just holds the leadership while it lasts, for
// use with outbox.Config.Leader:
//
//	el := store.Elector(mysql.ElectorOptions{})
//	go el.Run(ctx, nil)
//	p, err := outbox.NewProcessor(store, router, outbox.Config{Leader: el})
//
// Run returns nil when ctx ends; it logs a connection that fails and
// tries again after RetryInterval.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	if lead == nil {
		lead = elect.Hold
	}
	for ctx.Err() == nil {
		conn, name, err := e.connect(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.d.env.Log.WarnContext(ctx, "outboxkit/mysql: elector cannot connect", "err", err)
			}
			if !elect.Sleep(ctx, e.opts.RetryInterval) {
				return nil
			}
			continue
		}
		e.campaign(ctx, conn, name, lead)
		discard(conn)
		if ctx.Err() == nil && !elect.Sleep(ctx, e.opts.RetryInterval) {
			return nil
		}
	}
	return nil
}

// connect takes a connection out of the store's pool and names the lock
// after its database.
func (e *Elector) connect(ctx context.Context) (*sql.Conn, string, error) {
	conn, err := e.d.db.Conn(ctx)
	if err != nil {
		return nil, "", err
	}
	var database sql.NullString
	if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database); err != nil {
		discard(conn)
		return nil, "", err
	}
	return conn, e.lockName(database.String), nil
}

// lockName is the GET_LOCK name of this election in database.
func (e *Elector) lockName(database string) string {
	name := "outboxkit:" + database + "." + e.d.q.messages + ":" + e.opts.Name
	if len(name) <= 64 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "outboxkit:" + hex.EncodeToString(sum[:20])
}

// discard closes conn for good instead of returning it to the pool: a
// user-level lock lives as long as its session, so a session that may
// still hold one must not serve anyone else.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// campaign uses conn until it fails or ctx ends.
func (e *Elector) campaign(ctx context.Context, conn *sql.Conn, name string, lead func(ctx context.Context)) {
	for ctx.Err() == nil {
		// GET_LOCK(name, 0) does not wait: 1 taken, 0 held by another
		// session, NULL an error.
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, name).Scan(&got); err != nil || !got.Valid {
			if ctx.Err() == nil {
				e.d.env.Log.WarnContext(ctx, "outboxkit/mysql: elector lost its connection", "err", cmpErr(err, errLockNull))
			}
			return
		}
		if got.Int64 != 1 {
			if !elect.Sleep(ctx, e.opts.RetryInterval) {
				return
			}
			continue
		}
		if !e.lead(ctx, conn, name, lead) {
			return
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_, err := conn.ExecContext(uctx, `DO RELEASE_LOCK(?)`, name)
		cancel()
		if err != nil {
			return
		}
	}
}

var errLockNull = errors.New("GET_LOCK returned NULL")

func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// lead runs the leader's term; it reports whether conn is still healthy
// (and still holds the lock).
func (e *Elector) lead(ctx context.Context, conn *sql.Conn, name string, lead func(ctx context.Context)) bool {
	err := elect.Term{
		Leader: &e.leader, Log: e.d.env.Log, Prefix: "outboxkit/mysql", Attrs: []any{"election", e.opts.Name},
		Every: e.opts.CheckInterval,
		Check: func(ctx context.Context) error {
			err := e.check(ctx, conn, name)
			if err != nil {
				e.d.env.Log.WarnContext(ctx, "outboxkit/mysql: leader lost its lock, stepping down", "err", err)
			}
			return err
		},
	}.Run(ctx, lead)
	// A term that ended with ctx still holds the lock on a healthy
	// connection: the caller releases it before Run returns, rather than
	// leave it to the server to end the session after the connection is
	// closed (a moment after Run returned).
	return err == nil
}

// check reports an error unless conn still holds the lock: IS_USED_LOCK
// names the session holding it, which must be this one. The check runs on
// a context of its own, so that ctx ending does not cut it off (the driver
// closes a connection whose query's context ends) and the lock can still
// be released.
func (e *Elector) check(ctx context.Context, conn *sql.Conn, name string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(e.opts.CheckInterval, elect.MinCheckTimeout))
	defer cancel()
	var mine sql.NullBool
	if err := conn.QueryRowContext(cctx, `SELECT IS_USED_LOCK(?) = CONNECTION_ID()`, name).Scan(&mine); err != nil {
		return err
	}
	if !mine.Bool {
		return errors.New("the lock is no longer this session's")
	}
	return nil
}
