package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"sort"
	"time"

	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// Claim is the store's claim (sqlstore.Dialect): in one BEGIN IMMEDIATE
// transaction it leases up to p.Limit due PENDING messages to p.Owner
// (PROCESSING, Attempts+1, ClaimedAt = now) and returns them in Seq order. It keeps FIFO
// per group: within a (tenant, topic, group) only a contiguous prefix of the
// group's open messages is claimed, so a message is skipped while an earlier
// message of its group is PROCESSING or PENDING and not claimed in the same
// call. Messages of group "" are never blocked.
//
// Due unordered messages are taken oldest first. Groups are visited one
// index seek each, starting after the group where the previous claim of this
// Store stopped, so that with a small Limit no group starves.
func (d *dialect) Claim(ctx context.Context, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error) {
	nowUS := now.UnixMicro()
	var topicsJSON string
	var topics map[string]bool
	if len(p.Topics) > 0 {
		b, err := json.Marshal(p.Topics)
		if err != nil {
			return nil, outbox.InvalidParam("Topics", err.Error())
		}
		topicsJSON = string(b)
		topics = make(map[string]bool, len(p.Topics))
		for _, t := range p.Topics {
			topics[t] = true
		}
	}
	var out []outbox.Message
	err := d.WriteTx(ctx, func(q sqlstore.Querier) error {
		// Unordered messages: the oldest due ones.
		query, args := d.q.claimUnordered, []any{nowUS, p.Limit}
		if topics != nil {
			query, args = d.q.claimUnorderedTopics, []any{nowUS, topicsJSON, p.Limit}
		}
		seqs, err := sqlstore.QuerySeqs(ctx, q, query, args...)
		if err != nil {
			return err
		}
		// Ordered groups: the claimable prefix of each, up to Limit in all.
		ordered, err := d.claimGroups(ctx, q, nowUS, topics, p.Limit)
		if err != nil {
			return err
		}
		seqs = append(seqs, ordered...)
		if len(seqs) == 0 {
			return nil
		}
		slices.Sort(seqs)
		// Cutting the merged list at Limit keeps a prefix of every group.
		seqs = seqs[:min(len(seqs), p.Limit)]
		list, _ := json.Marshal(seqs)
		// One token for the claim: each message is claimed once in it.
		rows, err := q.QueryContext(ctx, d.q.claimUpdate, nowUS, p.Owner, nowUS, outbox.NewClaimToken(), string(list))
		if err != nil {
			return err
		}
		out, err = sqlstore.ScanMessages(rows)
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// groupKey is (tenant, topic, grp), ordered as SQLite compares it (BINARY
// collation: byte order, as Go compares strings).
type groupKey = sqlstore.GroupKey

// claimGroups walks the groups that have open messages, from the store's
// cursor round to it again, and returns the seqs of up to limit claimable
// messages: for each group whose head (first open message) is PENDING and
// due, the run of PENDING due messages from the head on: at most
// Options.ClaimPerGroup of them while other groups wait, more when the walk
// ends with room left.
func (d *dialect) claimGroups(ctx context.Context, q sqlstore.Querier, nowUS int64, topics map[string]bool, limit int) ([]int64, error) {
	next, err := q.PrepareContext(ctx, d.q.nextGroupHead)
	if err != nil {
		return nil, err
	}
	defer next.Close()
	var prefix *sql.Stmt
	defer func() {
		if prefix != nil {
			prefix.Close()
		}
	}()

	pauses, err := sqlstore.Pauses(ctx, q, d.q.pauses)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	start := d.cursor
	d.mu.Unlock()
	perGroup := d.env.ClaimPerGroup
	var (
		out     []int64
		capped  []groupKey
		cur     = start
		wrapped = false
	)
	for len(out) < limit {
		var (
			k      groupKey
			status string
			due    int64
		)
		err := next.QueryRowContext(ctx, cur.Tenant, cur.Topic, cur.Grp).Scan(&k.Tenant, &k.Topic, &k.Grp, &status, &due)
		if sqlstore.IsNoRows(err) {
			if wrapped || start == (groupKey{}) {
				break
			}
			wrapped, cur = true, groupKey{} // below every group: topics are never empty
			continue
		}
		if err != nil {
			return nil, err
		}
		if wrapped && start.Less(k) {
			break // full circle: start itself is visited last
		}
		cur = k
		if k.Grp == "" || (topics != nil && !topics[k.Topic]) || status != string(outbox.StatusPending) || due > nowUS || paused(pauses, k) {
			continue
		}
		if prefix == nil {
			if prefix, err = q.PrepareContext(ctx, d.q.groupPrefix); err != nil {
				return nil, err
			}
		}
		n := min(perGroup, limit-len(out))
		seqs, err := readPrefix(ctx, prefix, k, nowUS, n, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, seqs...)
		if len(seqs) == n {
			capped = append(capped, k) // its run may go on
		}
	}
	d.mu.Lock()
	d.cursor = cur
	d.mu.Unlock()
	// Room left (few groups are claimable): extend the runs cut at perGroup,
	// so that a deep backlog in one group still fills a claim.
	for _, k := range capped {
		if len(out) >= limit {
			break
		}
		seqs, err := readPrefix(ctx, prefix, k, nowUS, limit-len(out), perGroup)
		if err != nil {
			return nil, err
		}
		out = append(out, seqs...)
	}
	return out, nil
}

// readPrefix reads up to n seqs of group k's open messages from offset on,
// stopping at the first one that is PROCESSING or not due. The offset
// messages before must be PENDING and due (read by an earlier call in the
// same transaction).
func readPrefix(ctx context.Context, prefix *sql.Stmt, k groupKey, nowUS int64, n, offset int) ([]int64, error) {
	rows, err := prefix.QueryContext(ctx, k.Tenant, k.Topic, k.Grp, n, offset)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var seq, at int64
		var st string
		if err := rows.Scan(&seq, &st, &at); err != nil {
			return nil, err
		}
		if st != string(outbox.StatusPending) || at > nowUS {
			break
		}
		out = append(out, seq)
	}
	return out, rows.Err()
}

// paused reports whether a pause (outbox.Admin) covers group k.
func paused(ps []outbox.Pause, k groupKey) bool {
	for _, p := range ps {
		if p.Matches(&outbox.Message{Tenant: k.Tenant, Topic: k.Topic, Group: k.Grp}) {
			return true
		}
	}
	return false
}
