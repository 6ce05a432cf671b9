package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageClaim implements outbox.Store: in one READ COMMITTED transaction it
// leases up to p.Limit due PENDING messages to p.Owner (PROCESSING,
// Attempts+1, ClaimedAt = Now) and returns them ordered by Seq.
//
// FIFO per group holds with any number of concurrent claimers, in this and
// other processes. Rows are locked with SELECT ... FOR UPDATE SKIP LOCKED,
// so claimers never wait for each other; then, for each ordered group, the
// group's open (PENDING or PROCESSING) messages are read in Seq order and
// only the run of messages this claim locked, from the group's first open
// message on, is claimed. A group whose earlier message is PROCESSING,
// waiting for a retry (PENDING, not due) or locked by another claimer is
// skipped. Messages of group "" are never blocked.
//
// Group heads are found by scanning the PENDING ordered messages in Seq
// order; a backlog of many messages behind a blocked group is scanned by
// each claim (one index probe per message) until Limit heads are found.
func (s *Store) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 || p.Limit > MaxClaimLimit {
		return nil, outbox.InvalidParam("Limit", fmt.Sprintf("must be between 1 and %d", MaxClaimLimit))
	}
	if p.Owner == "" {
		return nil, outbox.InvalidParam("Owner", "is required")
	}
	for _, t := range p.Topics {
		if t == "" {
			return nil, outbox.InvalidParam("Topics", "contains an empty topic")
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.now(p.Now)
	var out []outbox.Message
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = s.claim(ctx, tx, p, now)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mysql: claim: %w", err)
	}
	return out, nil
}

func (s *Store) claim(ctx context.Context, tx *sql.Tx, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error) {
	m := s.q.messages
	nowS := ts(now)
	topicFilter := ""
	var topicArgs []any
	if len(p.Topics) > 0 {
		topicFilter = " AND topic IN (" + placeholders(len(p.Topics)) + ")"
		for _, t := range p.Topics {
			topicArgs = append(topicArgs, t)
		}
	}
	// Unordered messages: the oldest due ones not locked by another claimer.
	args := append(append([]any{nowS}, topicArgs...), p.Limit)
	seqs, err := querySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+s.prefix+`messages_claim)
		WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?`+topicFilter+`
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
	in := placeholders(len(seqs))
	args = []any{nowS, p.Owner, nowS}
	for _, q := range seqs {
		args = append(args, q)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+m+` SET status = 'PROCESSING', attempts = attempts + 1,
		claimed_at = ?, claimed_by = ?, updated_at = ? WHERE seq IN (`+in+`)`, args...); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+messageCols+` FROM `+m+` WHERE seq IN (`+in+`) ORDER BY seq`, args[3:]...)
	if err != nil {
		return nil, err
	}
	return scanMessages(rows)
}

type head struct {
	k   groupKey
	seq int64
}

// claimGroups returns the seqs of up to limit claimable ordered messages,
// locked by this transaction: for each group whose first open message is
// PENDING and due, the run of due PENDING messages from it on (at most
// Options.ClaimPerGroup while other groups wait, more when there is room),
// cut at the first message that is not due, PROCESSING, or locked by
// another claimer.
func (s *Store) claimGroups(ctx context.Context, tx *sql.Tx, nowS, topicFilter string, topicArgs []any, limit int) ([]int64, error) {
	m := s.q.messages
	// Heads: due PENDING ordered messages with no earlier open message in
	// their group (as of now; re-checked below once the run is locked).
	// More heads than limit are read: a head another claimer holds yields
	// nothing, and the claim goes on with the next.
	args := append(append([]any{nowS}, topicArgs...), min(4*limit, limit+100))
	rows, err := tx.QueryContext(ctx, `SELECT w.tenant, w.topic, w.grp, w.seq
		FROM `+m+` w FORCE INDEX (`+s.prefix+`messages_claim)
		WHERE w.status = 'PENDING' AND w.grp <> '' AND w.next_attempt_at <= ?`+strings.ReplaceAll(topicFilter, "topic", "w.topic")+`
			AND NOT EXISTS (
				SELECT 1 FROM `+m+` b FORCE INDEX (`+s.prefix+`messages_group_status)
				WHERE b.tenant = w.tenant AND b.topic = w.topic AND b.grp = w.grp
					AND b.status IN ('PENDING', 'PROCESSING') AND b.seq < w.seq)
		ORDER BY w.seq LIMIT ?`, args...)
	if err != nil {
		return nil, err
	}
	var heads []head
	for rows.Next() {
		var h head
		if err := rows.Scan(&h.k.tenant, &h.k.topic, &h.k.grp, &h.seq); err != nil {
			rows.Close()
			return nil, err
		}
		heads = append(heads, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var (
		out    []int64
		capped []int // indexes into heads of runs cut at perGroup
		taken  = make([]int, len(heads))
	)
	for i, h := range heads {
		if len(out) >= limit {
			break
		}
		n := min(s.claimPerGroup, limit-len(out))
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
func (s *Store) lockRun(ctx context.Context, tx *sql.Tx, h head, nowS string, n, skip int) ([]int64, error) {
	m := s.q.messages
	// Lock the due PENDING messages of the group from the head on; rows
	// other claimers hold are skipped (leaving gaps, found below).
	locked, err := querySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+s.prefix+`messages_group_seq)
		WHERE tenant = ? AND topic = ? AND grp = ? AND seq >= ?
			AND status = 'PENDING' AND next_attempt_at <= ?
		ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`,
		h.k.tenant, h.k.topic, h.k.grp, h.seq, nowS, n+skip)
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
	open, err := querySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+s.prefix+`messages_group_status)
		WHERE tenant = ? AND topic = ? AND grp = ? AND seq <= ? AND status IN ('PENDING', 'PROCESSING')
		ORDER BY seq`,
		h.k.tenant, h.k.topic, h.k.grp, locked[len(locked)-1])
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

func querySeqs(ctx context.Context, q querier, query string, args ...any) ([]int64, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
