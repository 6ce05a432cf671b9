package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// Fair share between tenants. A claim's window is the oldest pending
// messages, so a burst from one tenant fills it, and without more a message
// another tenant enqueued after the burst would wait until the burst is
// worked. So, while claims are full (the last claim with the same topic
// filter took its whole limit: a backlog longer than a claim), at most every
// fairEvery, a claim first looks
// at the next fairTenants tenants that have waiting messages (in byte
// order, from where the last look ended, round the ring) and, when there
// are two or more, claims for each of them, ahead of the window, the run of
// the first group (in the group index's order) whose first waiting message
// is due, up to half the claim's limit. Every tenant with ordered messages
// due is so visited within (tenants / fairTenants) x fairEvery, whatever
// another tenant's backlog. Unordered messages (group "") are claimed oldest
// first, with no fair share.
const (
	fairEvery   = 100 * time.Millisecond
	fairTenants = 16
)

// fairShare keeps, per topic filter, when a claim last looked at the
// tenants and where the next look starts.
type fairShare struct {
	mu     sync.Mutex
	last   map[string]time.Time
	from   map[string]string
	filled map[string]bool // the last claim took its whole limit
	every  time.Duration   // fairEvery; tests set less
}

// due reports whether a claim with topic filter key made at now looks at
// the tenants, and from which one on.
func (f *fairShare) due(key string, now time.Time) (from string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	if !f.filled[key] {
		return "", false
	}
	if l, seen := f.last[key]; seen && now.Sub(l) < f.every && !now.Before(l) {
		return "", false
	}
	f.last[key] = now
	return f.from[key], true
}

// init makes the maps; f.mu is held.
func (f *fairShare) init() {
	if f.last == nil {
		f.last, f.from, f.filled = map[string]time.Time{}, map[string]string{}, map[string]bool{}
	}
}

// claimed records whether a claim took its whole limit.
func (f *fairShare) claimed(key string, full bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	f.filled[key] = full
}

// next records where the next look starts: after the last tenant seen, or
// from the start when the look reached the end of the ring.
func (f *fairShare) next(key string, tenants []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(tenants) < fairTenants {
		f.from[key] = ""
		return
	}
	// The least string after the last tenant (tenants hold no NUL).
	f.from[key] = tenants[len(tenants)-1] + "\x01"
}

// claimFair runs the fair-share claim when it is due: the runs of the
// first due group of each of the next tenants, when there are two or more.
func (s *Store) claimFair(ctx context.Context, key string, p outbox.MessageClaimParams, now time.Time, owner string, run int, floors string) ([]outbox.Message, error) {
	from, ok := s.fair.due(key, time.Now())
	if !ok {
		return nil, nil
	}
	var tenants []string
	err := s.planned(ctx, s.sql.fairTenants, []any{from, fairTenants}, func(r pgx.Rows) error {
		var t string
		if err := r.Scan(&t); err != nil {
			return err
		}
		tenants = append(tenants, t)
		return nil
	})
	if err != nil {
		return nil, wrapErr("claim", err)
	}
	s.fair.next(key, tenants)
	if len(tenants) < 2 {
		return nil, nil
	}
	limit := max(1, p.Limit/2)
	stmt := s.sql.claimFairAll
	args := []any{now, owner, limit, 0, run, tenants, floors}
	if len(p.Topics) > 0 {
		stmt = s.sql.claimFairTopics
		args = append(args, p.Topics)
	}
	msgs, win, err := s.claim(ctx, planSettings, stmt, args)
	if err != nil {
		return nil, err
	}
	s.sawServer(win.server)
	s.floors.claimed(msgs)
	return msgs, nil
}

// fairTenantsSQL is the next $2 tenants from $1 on (in byte order) that
// have a waiting message: one descent of the group index each.
func fairTenantsSQL() string {
	return `WITH RECURSIVE tn AS (
	(SELECT m.tenant FROM {T} m WHERE ` + waiting("m") + ` AND m.tenant >= $1
	ORDER BY m.tenant, m.topic, m.grp, m.seq
	LIMIT 1)
	UNION ALL
	SELECT (SELECT m.tenant FROM {T} m WHERE ` + waiting("m") + ` AND m.tenant > tn.tenant
		ORDER BY m.tenant, m.topic, m.grp, m.seq
		LIMIT 1)
	FROM tn WHERE tn.tenant IS NOT NULL
)
SELECT tenant FROM tn WHERE tenant IS NOT NULL LIMIT $2`
}
