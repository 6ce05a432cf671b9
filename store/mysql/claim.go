package mysql

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// claim is the store's MessageClaim: in one READ COMMITTED transaction it
// leases up to p.Limit due PENDING messages to p.Owner (PROCESSING,
// Attempts+1, ClaimedAt = now) and returns them ordered by Seq.
//
// FIFO per group holds with any number of concurrent claimers, in this and
// other processes. Rows are locked with SELECT ... FOR UPDATE SKIP LOCKED,
// so claimers never wait for each other; then, for each ordered group, the
// group's open messages (PENDING, PROCESSING, or a dead letter that blocks
// its group) are read in Seq order and only the run of messages this claim
// locked, from the group's first open message on, is claimed. A group whose earlier message is PROCESSING,
// waiting for a retry (PENDING, not due), a blocking dead letter, or locked
// by another claimer is skipped. Messages of group "" are never blocked.
//
// Group heads are found among the oldest due PENDING ordered messages (a
// bounded window, so a claim's cost does not grow with the backlog), and
// beyond it, group by group, when the window's groups are blocked (see
// claimGroups).
func (s *Store) claim(ctx context.Context, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error) {
	var out []outbox.Message
	err := s.inTx(ctx, func(tx sqlstore.Querier) error {
		var err error
		out, err = s.claimTx(ctx, tx, p, now)
		return err
	})
	return out, err
}

func (s *Store) claimTx(ctx context.Context, tx sqlstore.Querier, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error) {
	m := s.q.messages
	nowS := ts(now)
	topicFilter := ""
	var topicArgs []any
	if len(p.Topics) > 0 {
		topicFilter = " AND topic IN (" + sqlstore.Placeholders(len(p.Topics)) + ")"
		for _, t := range p.Topics {
			topicArgs = append(topicArgs, t)
		}
	}
	// Unordered messages: the oldest due ones not locked by another claimer.
	args := append(append([]any{nowS}, topicArgs...), p.Limit)
	seqs, err := sqlstore.QuerySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+s.env.Prefix+`messages_claim)
		WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?`+topicFilter+adminsql.NotPaused(s.PausesTable(), "")+`
		ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`, args...)
	if err != nil {
		return nil, err
	}
	ordered, err := s.claimGroups(ctx, tx, nowS, topicFilter, topicArgs, p.Limit)
	if err != nil {
		return nil, err
	}
	seqs = append(seqs, ordered...)
	if len(seqs) == 0 {
		return nil, nil
	}
	slices.Sort(seqs)
	// Cutting the merged list at Limit keeps a prefix of every group's run.
	seqs = seqs[:min(len(seqs), p.Limit)]
	in := sqlstore.Placeholders(len(seqs))
	args = []any{nowS, p.Owner, nowS}
	for _, q := range seqs {
		args = append(args, q)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+m+` SET status = 'PROCESSING', attempts = attempts + 1,
		claimed_at = ?, claimed_by = ?, updated_at = ? WHERE seq IN (`+in+`)`, args...); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+sqlstore.MessageCols+` FROM `+m+` WHERE seq IN (`+in+`) ORDER BY seq`, args[3:]...)
	if err != nil {
		return nil, err
	}
	return sqlstore.ScanMessages(rows)
}

type head struct {
	k   sqlstore.GroupKey
	seq int64
}

// claimGroups returns the seqs of up to limit claimable ordered messages,
// locked by this transaction: for each group whose first open message is
// PENDING and due, the run of due PENDING messages from it on (at most
// Options.ClaimPerGroup while other groups wait, more when there is room),
// cut at the first message that is not due, PROCESSING, or locked by
// another claimer.
//
// Heads are looked for among the oldest due PENDING ordered messages (a
// window of 4 x limit, at least 1,000 and at most 20,000, read in sequence
// order from messages_head), so a claim's cost does not grow with the
// backlog. When the window is full and its heads do not fill the claim
// (long backlogs behind groups that are blocked), a second query visits
// every group with a PENDING message (a loose scan of
// messages_group_status: one index descent per group), so no group starves
// behind blocked ones.
func (s *Store) claimGroups(ctx context.Context, tx sqlstore.Querier, nowS, topicFilter string, topicArgs []any, limit int) ([]int64, error) {
	m := s.q.messages
	wTopic := strings.ReplaceAll(topicFilter, "topic", "w.topic")
	// The window's last seq: none when the window is not full (every
	// due PENDING ordered message is in it).
	budget := min(max(4*limit, 1000), 20000)
	var windowEnd int64
	full := true
	args := append(append([]any{nowS}, topicArgs...), budget-1)
	err := tx.QueryRowContext(ctx, `SELECT w.seq FROM `+m+` w FORCE INDEX (`+s.env.Prefix+`messages_head)
		WHERE w.status = 'PENDING' AND w.grp <> '' AND w.next_attempt_at <= ?`+wTopic+`
		ORDER BY w.seq LIMIT 1 OFFSET ?`, args...).Scan(&windowEnd)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		full = false
	case err != nil:
		return nil, err
	}
	// Heads: due PENDING ordered messages with no earlier open message in
	// their group (as of now; re-checked below once the run is locked).
	// More heads than limit are read: a head another claimer holds yields
	// nothing, and the claim goes on with the next.
	window := ""
	args = append([]any{nowS}, topicArgs...)
	if full {
		window = ` AND w.seq <= ?`
		args = append(args, windowEnd)
	}
	args = append(args, min(4*limit, limit+100))
	heads, err := s.queryHeads(ctx, tx, `SELECT w.tenant, w.topic, w.grp, w.seq
		FROM `+m+` w FORCE INDEX (`+s.env.Prefix+`messages_head)
		WHERE w.status = 'PENDING' AND w.grp <> '' AND w.next_attempt_at <= ?`+wTopic+window+
		adminsql.NotPaused(s.PausesTable(), "w.")+s.noEarlierOpen("w")+`
		ORDER BY w.seq LIMIT ?`, args...)
	if err != nil {
		return nil, err
	}
	out, err := s.lockRuns(ctx, tx, heads, nowS, limit, nil)
	if err != nil || len(out) >= limit || !full {
		return out, err
	}
	// The window was full and did not fill the claim: the groups whose
	// first PENDING message lies beyond it, oldest first.
	args = append(append([]any{}, topicArgs...), windowEnd, nowS, limit-len(out)+100)
	more, err := s.queryHeads(ctx, tx, `SELECT w.tenant, w.topic, w.grp, w.seq
		FROM (SELECT tenant, topic, grp, MIN(seq) AS seq
			FROM `+m+` FORCE INDEX (`+s.env.Prefix+`messages_group_status)
			WHERE status = 'PENDING' AND grp <> ''`+topicFilter+`
			GROUP BY tenant, topic, grp) g
		JOIN `+m+` w ON w.seq = g.seq
		WHERE g.seq > ? AND w.next_attempt_at <= ?`+adminsql.NotPaused(s.PausesTable(), "w.")+s.noEarlierOpen("w")+`
		ORDER BY g.seq LIMIT ?`, args...)
	if err != nil {
		return nil, err
	}
	return s.lockRuns(ctx, tx, more, nowS, limit, out)
}

// noEarlierOpen is the head condition on the message aliased w: no earlier
// open message in its group (PENDING, PROCESSING, or a dead letter that
// blocks its group).
func (s *Store) noEarlierOpen(w string) string {
	return `
			AND NOT EXISTS (
				SELECT 1 FROM ` + s.q.messages + ` b FORCE INDEX (` + s.env.Prefix + `messages_group_status)
				WHERE b.tenant = ` + w + `.tenant AND b.topic = ` + w + `.topic AND b.grp = ` + w + `.grp
					AND b.status IN ('PENDING', 'PROCESSING', 'FAILED') AND b.seq < ` + w + `.seq
					AND (b.status <> 'FAILED' OR b.blocks_group))`
}

// queryHeads runs a query returning (tenant, topic, grp, seq) rows.
func (s *Store) queryHeads(ctx context.Context, tx sqlstore.Querier, query string, args ...any) ([]head, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var heads []head
	for rows.Next() {
		var h head
		if err := rows.Scan(&h.k.Tenant, &h.k.Topic, &h.k.Grp, &h.seq); err != nil {
			return nil, err
		}
		heads = append(heads, h)
	}
	return heads, rows.Err()
}

// lockRuns appends to out the runs of heads' groups, in heads' order, until
// out holds limit seqs: at most Options.ClaimPerGroup per group at first,
// then more of the runs cut there while there is room.
func (s *Store) lockRuns(ctx context.Context, tx sqlstore.Querier, heads []head, nowS string, limit int, out []int64) ([]int64, error) {
	var (
		capped []int // indexes into heads of runs cut at perGroup
		taken  = make([]int, len(heads))
	)
	for i, h := range heads {
		if len(out) >= limit {
			break
		}
		n := min(s.env.ClaimPerGroup, limit-len(out))
		seqs, err := s.lockRun(ctx, tx, h, nowS, n, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, seqs...)
		taken[i] = len(seqs)
		if len(seqs) == n {
			capped = append(capped, i)
		}
	}
	// Room left: extend the runs cut at perGroup, so that a deep backlog in
	// a few groups still fills a claim.
	for _, i := range capped {
		if len(out) >= limit {
			break
		}
		seqs, err := s.lockRun(ctx, tx, heads[i], nowS, limit-len(out), taken[i])
		if err != nil {
			return nil, err
		}
		out = append(out, seqs...)
	}
	return out, nil
}

// lockRun locks up to n messages of h's group from its head on, skipping
// the first skip open messages (locked by this transaction already), and
// returns those that extend the group's claimable run.
func (s *Store) lockRun(ctx context.Context, tx sqlstore.Querier, h head, nowS string, n, skip int) ([]int64, error) {
	m := s.q.messages
	// Lock the due PENDING messages of the group from the head on; rows
	// other claimers hold are skipped (leaving gaps, found below).
	locked, err := sqlstore.QuerySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+s.env.Prefix+`messages_group_seq)
		WHERE tenant = ? AND topic = ? AND grp = ? AND seq >= ?
			AND status = 'PENDING' AND next_attempt_at <= ?
		ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`,
		h.k.Tenant, h.k.Topic, h.k.Grp, h.seq, nowS, n+skip)
	if err != nil || len(locked) == 0 {
		return nil, err
	}
	mine := make(map[int64]bool, len(locked))
	for _, q := range locked {
		mine[q] = true
	}
	// The group's open messages in order, as committed now (READ
	// COMMITTED): the run is the prefix this transaction locked. An earlier
	// open message this claim does not hold (PROCESSING, not due, or locked
	// by another claimer) ends it at once.
	open, err := sqlstore.QuerySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+s.env.Prefix+`messages_group_status)
		WHERE tenant = ? AND topic = ? AND grp = ? AND seq <= ?
			AND status IN ('PENDING', 'PROCESSING', 'FAILED') AND (status <> 'FAILED' OR blocks_group)
		ORDER BY seq`,
		h.k.Tenant, h.k.Topic, h.k.Grp, locked[len(locked)-1])
	if err != nil {
		return nil, err
	}
	var run []int64
	for _, q := range open {
		if !mine[q] {
			break
		}
		run = append(run, q)
	}
	if skip >= len(run) {
		return nil, nil
	}
	return run[skip:], nil
}
