package mysql

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/internal/sqlstore"
	"github.com/outboxkit/outboxkit/outbox"
)

// Claim is the store's claim (sqlstore.Dialect): in one READ COMMITTED
// transaction it leases up to p.Limit due PENDING messages to p.Owner
// (PROCESSING, Attempts+1, ClaimedAt = now) and returns them ordered by Seq.
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
func (d *dialect) Claim(ctx context.Context, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error) {
	var out []outbox.Message
	err := d.WriteTx(ctx, func(tx sqlstore.Querier) error {
		var err error
		out, err = d.claimTx(ctx, tx, p, now)
		return err
	})
	return out, err
}

func (d *dialect) claimTx(ctx context.Context, tx sqlstore.Querier, p outbox.MessageClaimParams, now time.Time) ([]outbox.Message, error) {
	m := d.q.messages
	nowS := ts(now)
	topicFilter := ""
	var topicArgs []any
	if len(p.Topics) > 0 {
		topicFilter = " AND topic IN (" + sqlstore.Placeholders(len(p.Topics)) + ")"
		for _, t := range p.Topics {
			topicArgs = append(topicArgs, t)
		}
	}
	// Unordered messages: the oldest due ones not locked by another
	// claimer. They are read from messages_claim without locking (twice
	// Limit, for those other claimers hold) and locked through the primary
	// key (see lockGroupRuns: a locking read through a secondary index
	// keeps that index's records of skipped rows locked).
	args := append(append([]any{nowS}, topicArgs...), 2*p.Limit)
	cands, err := sqlstore.QuerySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (`+d.env.Prefix+`messages_claim)
		WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= ?`+topicFilter+adminsql.NotPaused(d.q.pauses, "")+`
		ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return nil, err
	}
	var seqs []int64
	if len(cands) > 0 {
		args = make([]any, 0, len(cands)+2)
		for _, q := range cands {
			args = append(args, q)
		}
		seqs, err = sqlstore.QuerySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (PRIMARY)
		WHERE seq IN (`+sqlstore.Placeholders(len(cands))+`) AND status = 'PENDING' AND next_attempt_at <= ?
		ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`, append(args, nowS, p.Limit)...)
		if err != nil {
			return nil, err
		}
	}
	ordered, err := d.claimGroups(ctx, tx, nowS, topicFilter, topicArgs, p.Limit)
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
	// One token for the claim: each message is claimed once in it.
	args = []any{nowS, p.Owner, nowS, outbox.NewClaimToken()}
	for _, q := range seqs {
		args = append(args, q)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+m+` SET status = 'PROCESSING', attempts = attempts + 1,
		claimed_at = ?, claimed_by = ?, updated_at = ?, claim_token = ? WHERE seq IN (`+in+`)`, args...); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+sqlstore.MessageCols+` FROM `+m+` WHERE seq IN (`+in+`) ORDER BY seq`, args[4:]...)
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
func (d *dialect) claimGroups(ctx context.Context, tx sqlstore.Querier, nowS, topicFilter string, topicArgs []any, limit int) ([]int64, error) {
	m := d.q.messages
	wTopic := strings.ReplaceAll(topicFilter, "topic", "w.topic")
	// The window's last seq: none when the window is not full (every
	// due PENDING ordered message is in it).
	budget := min(max(4*limit, 1000), 20000)
	var windowEnd int64
	full := true
	args := append(append([]any{nowS}, topicArgs...), budget-1)
	err := tx.QueryRowContext(ctx, `SELECT w.seq FROM `+m+` w FORCE INDEX (`+d.env.Prefix+`messages_head)
		WHERE w.status = 'PENDING' AND w.grp <> '' AND w.next_attempt_at <= ?`+wTopic+`
		ORDER BY w.seq LIMIT 1 OFFSET ?`, args...).Scan(&windowEnd)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		full = false
	case err != nil:
		return nil, err
	}
	// Heads: due PENDING ordered messages with no earlier open message in
	// their group (as of now; re-checked once the run is locked), read a
	// page at a time: twice the groups that would fill the room with full
	// runs (a head another claimer holds yields nothing, and the claim goes
	// on with the next), from the window's oldest on.
	window := ""
	if full {
		window = ` AND w.seq <= ?`
	}
	headsSQL := `SELECT w.tenant, w.topic, w.grp, w.seq
		FROM ` + m + ` w FORCE INDEX (` + d.env.Prefix + `messages_head)
		WHERE w.status = 'PENDING' AND w.grp <> '' AND w.next_attempt_at <= ?` + wTopic + ` AND w.seq > ?` + window +
		adminsql.NotPaused(d.q.pauses, "w.") + d.noEarlierOpen("w") + `
		ORDER BY w.seq LIMIT ?`
	per := d.env.ClaimPerGroup
	var (
		out    []int64
		capped []groupRun
		after  int64
	)
	for len(out) < limit {
		page := min(2*((limit-len(out)+per-1)/per+8), maxRoundGroups)
		args := append(append([]any{nowS}, topicArgs...), after)
		if full {
			args = append(args, windowEnd)
		}
		heads, err := d.queryHeads(ctx, tx, headsSQL, append(args, page)...)
		if err != nil {
			return nil, err
		}
		if len(heads) == 0 {
			break
		}
		var c []groupRun
		if out, c, err = d.lockRuns(ctx, tx, heads, nowS, limit, out); err != nil {
			return nil, err
		}
		capped = append(capped, c...)
		after = heads[len(heads)-1].seq
		if len(heads) < page {
			break
		}
	}
	if len(out) < limit && full {
		// The window was full and did not fill the claim: the groups
		// whose first PENDING message lies beyond it, oldest first.
		args := append(append([]any{}, topicArgs...), windowEnd, nowS, limit-len(out)+100)
		more, err := d.queryHeads(ctx, tx, `SELECT w.tenant, w.topic, w.grp, w.seq
		FROM (SELECT tenant, topic, grp, MIN(seq) AS seq
			FROM `+m+` FORCE INDEX (`+d.env.Prefix+`messages_group_status)
			WHERE status = 'PENDING' AND grp <> ''`+topicFilter+`
			GROUP BY tenant, topic, grp) g
		JOIN `+m+` w ON w.seq = g.seq
		WHERE g.seq > ? AND w.next_attempt_at <= ?`+adminsql.NotPaused(d.q.pauses, "w.")+d.noEarlierOpen("w")+`
		ORDER BY g.seq LIMIT ?`, args...)
		if err != nil {
			return nil, err
		}
		var c []groupRun
		if out, c, err = d.lockRuns(ctx, tx, more, nowS, limit, out); err != nil {
			return nil, err
		}
		capped = append(capped, c...)
	}
	return d.extendRuns(ctx, tx, capped, nowS, limit, out)
}

// noEarlierOpen is the head condition on the message aliased w: no earlier
// open message in its group (PENDING, PROCESSING, or a dead letter that
// blocks its group).
func (d *dialect) noEarlierOpen(w string) string {
	return `
			AND NOT EXISTS (
				SELECT 1 FROM ` + d.q.messages + ` b FORCE INDEX (` + d.env.Prefix + `messages_group_status)
				WHERE b.tenant = ` + w + `.tenant AND b.topic = ` + w + `.topic AND b.grp = ` + w + `.grp
					AND b.status IN ('PENDING', 'PROCESSING', 'FAILED') AND b.seq < ` + w + `.seq
					AND (b.status <> 'FAILED' OR b.blocks_group))`
}

// queryHeads runs a query returning (tenant, topic, grp, seq) rows.
func (d *dialect) queryHeads(ctx context.Context, tx sqlstore.Querier, query string, args ...any) ([]head, error) {
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

// lockRuns appends to out the claimable runs of heads' groups, taking
// heads in order until out holds limit seqs, at most Options.ClaimPerGroup
// messages per group; it returns the runs cut there that could go on (see
// extendRuns). Each round costs two statements whatever the number of
// groups in it (see lockGroupRuns).
func (d *dialect) lockRuns(ctx context.Context, tx sqlstore.Querier, heads []head, nowS string, limit int, out []int64) ([]int64, []groupRun, error) {
	per := d.env.ClaimPerGroup
	var capped []groupRun
	for i := 0; i < len(heads) && len(out) < limit; {
		room := limit - len(out)
		// Enough groups to fill the room if each gives a full run, and a
		// few more for those another claimer holds.
		k := min(len(heads)-i, (room+per-1)/per+8, maxRoundGroups)
		chunk := make([]groupRun, k)
		for j, h := range heads[i : i+k] {
			chunk[j] = groupRun{h: h, from: h.seq, n: min(per, room)}
		}
		i += k
		if err := d.lockGroupRuns(ctx, tx, chunk, nowS); err != nil {
			return nil, nil, err
		}
		for _, r := range chunk {
			out = append(out, r.run...)
			if r.more {
				capped = append(capped, r)
			}
		}
	}
	return out, capped, nil
}

// extendRuns uses the room left in a claim to extend the runs cut at
// Options.ClaimPerGroup, in order, so that a deep backlog in a few groups
// still fills a claim.
func (d *dialect) extendRuns(ctx context.Context, tx sqlstore.Querier, capped []groupRun, nowS string, limit int, out []int64) ([]int64, error) {
	per := d.env.ClaimPerGroup
	for len(capped) > 0 && len(out) < limit {
		room := limit - len(out)
		chunk := make([]groupRun, min(len(capped), (room+per-1)/per+8, maxRoundGroups))
		for j, r := range capped[:len(chunk)] {
			chunk[j] = groupRun{h: r.h, from: r.run[len(r.run)-1] + 1, n: room}
		}
		capped = capped[len(chunk):]
		if err := d.lockGroupRuns(ctx, tx, chunk, nowS); err != nil {
			return nil, err
		}
		for _, r := range chunk {
			out = append(out, r.run...)
		}
	}
	return out, nil
}

// maxRoundGroups bounds the groups of one lockGroupRuns call (6 parameters
// each, well under the protocol's 65,535 per statement).
const maxRoundGroups = 1000

// groupRun is one group's part of a claim: lockGroupRuns reads its open
// messages from seq from on and sets run to the due PENDING messages it
// locked from there, without a gap, at most n.
type groupRun struct {
	h    head
	from int64
	n    int
	run  []int64
	more bool // run has n messages and the group has more claimable
}

// lockGroupRuns fills in the runs of several groups in two statements. The
// first reads each group's open messages (PENDING, PROCESSING, or a dead
// letter that blocks its group) in sequence order from r.from on, as
// committed now (READ COMMITTED): the candidates are the due PENDING ones
// before the first that is not (PROCESSING, waiting for a retry, blocking),
// at most r.n. The second locks every candidate of every group, skipping
// rows other claimers hold and rows no longer PENDING and due; a group's
// run is the prefix of its candidates that was locked, so a message
// another claimer holds (or took since the read) ends the run before it.
func (d *dialect) lockGroupRuns(ctx context.Context, tx sqlstore.Querier, runs []groupRun, nowS string) error {
	m := d.q.messages
	var (
		b    strings.Builder
		args []any
	)
	for j, r := range runs {
		if j > 0 {
			b.WriteString(" UNION ALL ")
		}
		if len(runs) > 1 {
			b.WriteByte('(')
		}
		b.WriteString(`SELECT ` + strconv.Itoa(j) + `, seq, status = 'PENDING' AND next_attempt_at <= ?
			FROM ` + m + ` FORCE INDEX (` + d.env.Prefix + `messages_group_seq)
			WHERE tenant = ? AND topic = ? AND grp = ? AND seq >= ?
				AND status IN ('PENDING', 'PROCESSING', 'FAILED') AND (status <> 'FAILED' OR blocks_group)
			ORDER BY seq LIMIT ?`)
		if len(runs) > 1 {
			b.WriteByte(')')
		}
		args = append(args, nowS, r.h.k.Tenant, r.h.k.Topic, r.h.k.Grp, r.from, r.n+1)
	}
	rows, err := tx.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return err
	}
	cands := make([][]int64, len(runs))
	stopped := make([]bool, len(runs))
	for rows.Next() {
		var j int
		var seq int64
		var ok bool
		if err := rows.Scan(&j, &seq, &ok); err != nil {
			rows.Close()
			return err
		}
		if j < 0 || j >= len(runs) {
			continue
		}
		switch {
		case stopped[j]:
		case !ok:
			stopped[j] = true
		case len(cands[j]) == runs[j].n:
			runs[j].more = true // the (n+1)th is claimable too
			stopped[j] = true
		default:
			cands[j] = append(cands[j], seq)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var all []any
	for _, c := range cands {
		for _, q := range c {
			all = append(all, q)
		}
	}
	if len(all) == 0 {
		return nil
	}
	// Through the primary key only: a locking read through a secondary
	// index also locks that index's records, and a row skipped there (held
	// by another claimer) leaves its record locked, which that claimer's
	// UPDATE then waits for (a deadlock seen with messages_head).
	locked, err := sqlstore.QuerySeqs(ctx, tx, `SELECT seq FROM `+m+` FORCE INDEX (PRIMARY)
		WHERE seq IN (`+sqlstore.Placeholders(len(all))+`) AND status = 'PENDING' AND next_attempt_at <= ?
		FOR UPDATE SKIP LOCKED`, append(all, nowS)...)
	if err != nil {
		return err
	}
	mine := make(map[int64]bool, len(locked))
	for _, q := range locked {
		mine[q] = true
	}
	for j, c := range cands {
		n := 0
		for n < len(c) && mine[c[n]] {
			n++
		}
		runs[j].run = c[:n]
		if n < len(c) {
			runs[j].more = false
		}
	}
	return nil
}
