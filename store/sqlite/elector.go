package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
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
	// RetryInterval is how often a follower tries to become leader when it
	// was not woken by the leader stepping down. Defaults to 5 s.
	RetryInterval time.Duration
	// CheckInterval is how often the leader checks that its database still
	// answers; a failed check (the Store closed) ends its leadership at
	// once. A check waits up to CheckInterval or 5 s, whichever is longer.
	// Defaults to 2 s.
	CheckInterval time.Duration
}

// Elector elects one leader among the Electors of one process on the same
// outbox: the same database file (resolved to its absolute path, symbolic
// links followed), table prefix and ElectorOptions.Name, through any
// number of Stores. A follower takes over at once when the leader steps down.
//
//	el := store.Elector(sqlite.ElectorOptions{})
//	err := el.Run(ctx, func(ctx context.Context) {
//		_ = processor.Run(ctx) // claims only while this Elector leads
//	})
//
// The election is in-process only: SQLite has no lock that lives with a
// connection and that another process could wait for, so two processes
// on one file each elect a leader of their own, and both claim. That is
// safe (every claim is a BEGIN IMMEDIATE transaction and keeps FIFO per
// group with any number of processors); single-active mode is for users
// who want one active processor, not a correctness requirement. A Store
// over an in-memory database (New over a ":memory:" *sql.DB) has an
// election of its own.
type Elector struct {
	d      *dialect
	opts   ElectorOptions
	leader atomic.Bool
}

// elections holds the in-process elections, by key (see Elector.key).
var elections = struct {
	sync.Mutex
	m map[string]*election
}{m: map[string]*election{}}

// election is one in-process leadership: its holder, and a channel closed
// when the holder lets it go.
type election struct {
	holder *Elector
	free   chan struct{}
}

// Elector returns an Elector for this store's outbox.
func (s *Store) Elector(opts ElectorOptions) *Elector {
	elect.Default(&opts.Name, &opts.RetryInterval, &opts.CheckInterval)
	return &Elector{d: s.d, opts: opts}
}

// IsLeader reports whether this Elector holds the leadership now.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Run campaigns until ctx ends. Each time this Elector becomes leader it
// calls lead with a context that is cancelled when leadership ends (ctx
// ended or the database stopped answering), waits for lead to return, and
// lets the leadership go; if lead returns on its own, Run lets it go and
// campaigns again. A nil lead just holds the leadership while it lasts,
// for use with outbox.Config.Leader:
//
//	el := store.Elector(sqlite.ElectorOptions{})
//	go el.Run(ctx, nil)
//	p, err := outbox.NewProcessor(store, router, outbox.Config{Leader: el})
//
// Run returns nil when ctx ends; it logs a database that does not answer
// and tries again after RetryInterval.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	if lead == nil {
		lead = elect.Hold
	}
	for ctx.Err() == nil {
		// Only an Elector whose database answers may lead.
		key, err := e.key(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.d.env.Log.WarnContext(ctx, "outboxkit/sqlite: elector cannot reach the database", "err", err)
			}
			if !elect.Sleep(ctx, e.opts.RetryInterval) {
				return nil
			}
			continue
		}
		free, ok := e.take(key)
		if !ok {
			t := time.NewTimer(e.opts.RetryInterval)
			select {
			case <-ctx.Done():
			case <-free:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		e.lead(ctx, lead)
		e.release(key)
	}
	return nil
}

// key names this Elector's election: the database file, the messages
// table and the election's name.
func (e *Elector) key(ctx context.Context) (string, error) {
	rows, err := e.d.db.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	file := ""
	for rows.Next() {
		var (
			seq  int
			name string
			path sql.NullString
		)
		if err := rows.Scan(&seq, &name, &path); err != nil {
			return "", err
		}
		if name == "main" {
			file = path.String
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if file == "" {
		// In memory: only this Store's connections see the database.
		file = fmt.Sprintf("memory:%p", e.d.db)
	} else if p, err := filepath.EvalSymlinks(file); err == nil {
		file = p
	}
	return file + "\x00" + e.d.q.messages + "\x00" + e.opts.Name, nil
}

// take makes e the holder of the election key when it is free; otherwise
// it returns a channel closed when the holder lets it go.
func (e *Elector) take(key string) (<-chan struct{}, bool) {
	elections.Lock()
	defer elections.Unlock()
	el := elections.m[key]
	if el == nil {
		el = &election{free: make(chan struct{})}
		elections.m[key] = el
	}
	if el.holder == nil {
		el.holder = e
		return nil, true
	}
	return el.free, false
}

// release lets the election key go and wakes its followers.
func (e *Elector) release(key string) {
	elections.Lock()
	defer elections.Unlock()
	if el := elections.m[key]; el != nil && el.holder == e {
		delete(elections.m, key)
		close(el.free)
	}
}

// lead runs the leader's term, checking every CheckInterval that the
// database still answers.
func (e *Elector) lead(ctx context.Context, lead func(ctx context.Context)) {
	_ = elect.Term{
		Leader: &e.leader, Log: e.d.env.Log, Prefix: "outboxkit/sqlite", Attrs: []any{"election", e.opts.Name},
		Every: e.opts.CheckInterval,
		Check: func(ctx context.Context) error {
			err := e.check(ctx)
			if err != nil {
				e.d.env.Log.WarnContext(ctx, "outboxkit/sqlite: leader's database does not answer, stepping down", "err", err)
			}
			return err
		},
	}.Run(ctx, lead)
}

// check runs a trivial query on the store's database.
func (e *Elector) check(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, max(e.opts.CheckInterval, elect.MinCheckTimeout))
	defer cancel()
	var one int
	err := e.d.db.QueryRowContext(cctx, `SELECT 1`).Scan(&one)
	if ctx.Err() != nil {
		return nil // stopping, not failing
	}
	return err
}
