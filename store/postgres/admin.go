package postgres

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.Admin = (*Store)(nil)

func tsOf(t time.Time) any { return t.UTC() }

// PausesTable returns the qualified name of the pauses table.
func (s *Store) PausesTable() string { return s.pauses }

// MessageSearch implements outbox.Admin: messages of every tenant matching
// p.Filter, in Seq order, a page at a time.
func (s *Store) MessageSearch(ctx context.Context, p outbox.MessageSearchParams) (outbox.MessagePage, error) {
	if err := p.Prepare(); err != nil {
		return outbox.MessagePage{}, err
	}
	p.Filter = textFilter(p.Filter)
	a := &adminsql.Args{Dollar: true}
	w := append(adminsql.Filter(p.Filter, "", a, tsOf), "seq > "+a.Add(p.AfterSeq))
	w = slices.Clip(w)
	// The rows not leased and the leased ones, merged by seq: the
	// (tenant, seq) index leaves the leased ones out (see MessageList).
	sel, lim := `SELECT `+msgCols+` FROM `+s.readTable(), ` ORDER BY seq LIMIT `+a.Add(p.Limit+1)
	r, err := s.db.Query(ctx, `SELECT `+msgCols+` FROM ((`+
		sel+adminsql.Where(append(w, "claimed_by IS NULL", "status <> 'PROCESSING'"))+lim+`) UNION ALL (`+
		sel+adminsql.Where(append(w, "status = 'PROCESSING'"))+lim+`)) s`+lim, a.Vals...)
	if err != nil {
		return outbox.MessagePage{}, wrapErr("search", err)
	}
	defer r.Close()
	var page outbox.MessagePage
	for r.Next() {
		m, err := scanMessage(r)
		if err != nil {
			return outbox.MessagePage{}, wrapErr("search", err)
		}
		page.Messages = append(page.Messages, m)
	}
	if err := r.Err(); err != nil {
		return outbox.MessagePage{}, wrapErr("search", err)
	}
	if len(page.Messages) > p.Limit {
		page.Messages = page.Messages[:p.Limit]
		page.NextAfterSeq = page.Messages[p.Limit-1].Seq
	}
	return page, nil
}

func textFilter(f outbox.MessageFilter) outbox.MessageFilter {
	f.Topic, f.Group, f.ErrorCode = text(f.Topic), text(f.Group), text(f.ErrorCode)
	if len(f.Tenants) > 0 {
		ts := make([]string, len(f.Tenants))
		for i, t := range f.Tenants {
			ts[i] = text(t)
		}
		f.Tenants = ts
	}
	return f
}

// MessageRequeueMany implements outbox.Admin: up to p.Limit FAILED messages
// matching p.Filter after p.AfterSeq go back to PENDING (due p.Now,
// attempts reset) in one statement. Rows another transaction holds locked
// are left for a later call.
func (s *Store) MessageRequeueMany(ctx context.Context, p outbox.MessageRequeueManyParams) (outbox.RequeueManyResult, error) {
	if p.Now.IsZero() {
		p.Now = s.at(time.Time{})
	}
	if err := p.Prepare(); err != nil {
		return outbox.RequeueManyResult{}, err
	}
	p.Filter = textFilter(p.Filter)
	a := &adminsql.Args{Dollar: true}
	w := append(adminsql.Filter(p.Filter, "", a, tsOf), "seq > "+a.Add(p.AfterSeq))
	sel := `SELECT id, seq FROM ` + s.messages + adminsql.Where(w) + ` ORDER BY seq LIMIT ` + a.Add(p.Limit+1)
	var res outbox.RequeueManyResult
	var seqs []int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		lock := ""
		if !p.DryRun {
			lock = " FOR UPDATE"
		}
		r, err := tx.Query(ctx, sel+lock, a.Vals...)
		if err != nil {
			return err
		}
		for r.Next() {
			var id string
			var seq int64
			if err := r.Scan(&id, &seq); err != nil {
				r.Close()
				return err
			}
			res.IDs = append(res.IDs, id)
			seqs = append(seqs, seq)
		}
		r.Close()
		if err := r.Err(); err != nil {
			return err
		}
		if len(seqs) > p.Limit {
			seqs, res.IDs = seqs[:p.Limit], res.IDs[:p.Limit]
			res.NextAfterSeq = seqs[p.Limit-1]
		}
		res.Matched = len(seqs)
		if p.DryRun || len(seqs) == 0 {
			return nil
		}
		moveWhere, keepWhere := "grp <> '' AND NOT blocks_group", "(grp = '' OR blocks_group)"
		if s.logMode {
			// The groups' claim locks first (logOperate), and an unordered
			// dead letter moves to the end too: its own done mark has
			// passed its old place.
			moveWhere, keepWhere = "NOT blocks_group", "blocks_group"
			r, err := tx.Query(ctx, s.lsql.logLockGroups, res.IDs, s.groupNS+logClaimLockKey)
			if err != nil {
				return err
			}
			r.Close()
			if err := r.Err(); err != nil {
				return err
			}
		}
		// A first-attempt success kept on the message row moves to the
		// attempts table before the requeue clears it (see finishSQL).
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.attempts+` (message_id, tenant, number, outcome, provider_response, started_at, finished_at)
			SELECT id, tenant, 1, 'SUCCEEDED', sent_response, sent_started_at, sent_finished_at FROM `+s.messages+`
			WHERE id = ANY($1::text[]) AND status = 'FAILED' AND sent_finished_at IS NOT NULL`, res.IDs); err != nil {
			return err
		}
		// As MessageRequeue: a dead letter that did not hold its group
		// goes to the end of it (a new sequence number, drawn under the
		// group's enqueue lock, taken in key order as enqueues take them).
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock($1::int4, k)) FROM (
			SELECT DISTINCT hashtext(tenant || chr(31) || topic || chr(31) || grp) AS k FROM `+s.messages+`
			WHERE id = ANY($2::text[]) AND status = 'FAILED' AND grp <> '' AND NOT blocks_group ORDER BY 1) keys`,
			s.groupNS, res.IDs); err != nil {
			return err
		}
		set := strings.ReplaceAll(requeueSet, "$3", "$1")
		moved, err := tx.Exec(ctx, `UPDATE `+s.messages+` SET seq = DEFAULT, `+set+`
			WHERE id = ANY($2::text[]) AND status = 'FAILED' AND `+moveWhere, p.Now, res.IDs)
		if err != nil {
			return err
		}
		kept, err := tx.Exec(ctx, `UPDATE `+s.messages+` SET `+set+`
			WHERE id = ANY($2::text[]) AND status = 'FAILED' AND `+keepWhere, p.Now, res.IDs)
		if err != nil {
			return err
		}
		res.Requeued = int(moved.RowsAffected() + kept.RowsAffected())
		if s.logMode && res.Requeued > 0 {
			if _, err := tx.Exec(ctx, s.lsql.logWake, res.IDs, p.Now); err != nil {
				return err
			}
		}
		if res.Requeued > 0 {
			_, err = tx.Exec(ctx, `SELECT pg_notify($1, '')`, s.channel)
		}
		return err
	})
	if err != nil {
		return outbox.RequeueManyResult{}, wrapErr("requeue many", err)
	}
	return res, nil
}

// TopicStats implements outbox.Admin. It reads the whole messages table
// (of the selected tenants): an operator's query, not one for a hot path.
func (s *Store) TopicStats(ctx context.Context, p outbox.TopicStatsParams) ([]outbox.TopicStat, error) {
	f := outbox.MessageFilter{Tenants: p.Tenants}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	a := &adminsql.Args{Dollar: true}
	w := adminsql.Filter(textFilter(f), "", a, tsOf)
	from := s.messages + adminsql.Where(w)
	if s.logMode {
		from = s.logStates(adminsql.Where(w))
	}
	r, err := s.db.Query(ctx, `SELECT topic, status, count(*), min(created_at) FROM `+from+
		` GROUP BY topic, status ORDER BY topic`, a.Vals...)
	if err != nil {
		return nil, wrapErr("topic stats", err)
	}
	defer r.Close()
	var out []outbox.TopicStat
	for r.Next() {
		var topic, status string
		var n int64
		var oldest time.Time
		if err := r.Scan(&topic, &status, &n, &oldest); err != nil {
			return nil, wrapErr("topic stats", err)
		}
		out = adminsql.AddStat(out, topic, outbox.Status(status), n, oldest.UTC())
	}
	if err := r.Err(); err != nil {
		return nil, wrapErr("topic stats", err)
	}
	return out, nil
}

// PauseAdd implements outbox.Admin.
func (s *Store) PauseAdd(ctx context.Context, p outbox.PauseAddParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	_, err := s.db.Exec(ctx, `INSERT INTO `+s.pauses+` (pause_topic, pause_grp, pause_tenant, created_at)
		VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, text(p.Topic), text(p.Group), text(p.Tenant), s.at(p.Now))
	return wrapErr("pause", err)
}

// PauseRemove implements outbox.Admin.
func (s *Store) PauseRemove(ctx context.Context, p outbox.PauseRemoveParams) (bool, error) {
	if err := p.Validate(); err != nil {
		return false, err
	}
	tag, err := s.db.Exec(ctx, `WITH del AS (
		DELETE FROM `+s.pauses+` WHERE pause_topic = $1 AND pause_grp = $2 AND pause_tenant = $3 RETURNING 1
	) SELECT pg_notify($4, '') FROM del`, text(p.Topic), text(p.Group), text(p.Tenant), s.channel)
	if err != nil {
		return false, wrapErr("resume", err)
	}
	if s.logMode {
		// The paused groups' messages may be behind this store's windows:
		// the next claims look from the start. (Other stores find them
		// with their next backstop.)
		s.logc.reset()
	}
	return tag.RowsAffected() > 0, nil
}

// PauseList implements outbox.Admin.
func (s *Store) PauseList(ctx context.Context, _ outbox.PauseListParams) ([]outbox.Pause, error) {
	r, err := s.db.Query(ctx, `SELECT pause_topic, pause_grp, pause_tenant, created_at FROM `+s.pauses+
		` ORDER BY pause_topic, pause_grp, pause_tenant`)
	if err != nil {
		return nil, wrapErr("pauses", err)
	}
	defer r.Close()
	var out []outbox.Pause
	for r.Next() {
		var p outbox.Pause
		if err := r.Scan(&p.Topic, &p.Group, &p.Tenant, &p.CreatedAt); err != nil {
			return nil, wrapErr("pauses", err)
		}
		p.CreatedAt = p.CreatedAt.UTC()
		out = append(out, p)
	}
	return out, wrapErr("pauses", r.Err())
}
