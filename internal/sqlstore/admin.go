package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/outboxkit/outboxkit/internal/adminsql"
	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.Admin = (*Store)(nil)

// PausesTable is the stores' PausesTable: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) PausesTable() string { return s.prefix + "pauses" }

func (s *Store) timeArg(t time.Time) any { return s.syntax.Time(t.UTC().Truncate(time.Microsecond)) }

// MessageSearch is the stores' MessageSearch: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageSearch(ctx context.Context, p outbox.MessageSearchParams) (outbox.MessagePage, error) {
	if err := p.Prepare(); err != nil {
		return outbox.MessagePage{}, err
	}
	a := &adminsql.Args{}
	w := append(adminsql.Filter(p.Filter, "", a, s.timeArg), "seq > "+a.Add(p.AfterSeq))
	rows, err := s.db.QueryContext(ctx, `SELECT `+MessageCols+` FROM `+s.messages+adminsql.Where(w)+
		` ORDER BY seq LIMIT `+a.Add(p.Limit+1), a.Vals...)
	if err != nil {
		return outbox.MessagePage{}, s.errorf("search", err)
	}
	msgs, err := ScanMessages(rows)
	if err != nil {
		return outbox.MessagePage{}, s.errorf("search", err)
	}
	var page outbox.MessagePage
	if len(msgs) > p.Limit {
		msgs = msgs[:p.Limit]
		page.NextAfterSeq = msgs[p.Limit-1].Seq
	}
	page.Messages = msgs
	return page, nil
}

// MessageRequeueMany is the stores' MessageRequeueMany: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageRequeueMany(ctx context.Context, p outbox.MessageRequeueManyParams) (outbox.RequeueManyResult, error) {
	if p.Now.IsZero() {
		p.Now = s.now(time.Time{})
	}
	if err := p.Prepare(); err != nil {
		return outbox.RequeueManyResult{}, err
	}
	var res outbox.RequeueManyResult
	err := s.dialect.WriteTx(ctx, func(q Querier) error {
		res = outbox.RequeueManyResult{}
		a := &adminsql.Args{}
		w := append(adminsql.Filter(p.Filter, "", a, s.timeArg), "seq > "+a.Add(p.AfterSeq))
		lock := ""
		if !p.DryRun {
			lock = s.syntax.ForUpdate
		}
		var seqs []int64
		err := scanRows(ctx, q, `SELECT seq, id FROM `+s.messages+adminsql.Where(w)+
			` ORDER BY seq LIMIT `+a.Add(p.Limit+1)+lock, a.Vals, func(r *sql.Rows) error {
			var seq int64
			var id string
			if err := r.Scan(&seq, &id); err != nil {
				return err
			}
			seqs = append(seqs, seq)
			res.IDs = append(res.IDs, id)
			return nil
		})
		if err != nil {
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
		now := s.timeArg(p.Now)
		r, err := q.ExecContext(ctx, `UPDATE `+s.messages+` SET `+requeueSet+`
			WHERE seq IN (`+Placeholders(len(seqs))+`) AND status = 'FAILED'`, append([]any{now, now}, Int64s(seqs)...)...)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		res.Requeued = int(n)
		return err
	})
	if err != nil {
		return outbox.RequeueManyResult{}, s.errorf("requeue many", err)
	}
	if res.Requeued > 0 {
		s.Notify()
	}
	return res, nil
}

// TopicStats is the stores' TopicStats: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) TopicStats(ctx context.Context, p outbox.TopicStatsParams) ([]outbox.TopicStat, error) {
	f := outbox.MessageFilter{Tenants: p.Tenants}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	a := &adminsql.Args{}
	w := adminsql.Filter(f, "", a, s.timeArg)
	var out []outbox.TopicStat
	err := scanRows(ctx, s.db, `SELECT topic, status, COUNT(*), MIN(created_at) FROM `+s.messages+
		adminsql.Where(w)+` GROUP BY topic, status ORDER BY topic`, a.Vals, func(r *sql.Rows) error {
		var topic, status string
		var n int64
		var oldest Time
		if err := r.Scan(&topic, &status, &n, &oldest); err != nil {
			return err
		}
		out = adminsql.AddStat(out, topic, outbox.Status(status), n, oldest.T)
		return nil
	})
	if err != nil {
		return nil, s.errorf("topic stats", err)
	}
	return out, nil
}

// PauseAdd is the stores' PauseAdd: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) PauseAdd(ctx context.Context, p outbox.PauseAddParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	insert, conflict := `INSERT INTO `, ` ON CONFLICT DO NOTHING`
	if s.syntax.Name == "mysql" {
		insert, conflict = `INSERT IGNORE INTO `, ``
	}
	_, err := s.db.ExecContext(ctx, insert+s.PausesTable()+` (pause_topic, pause_grp, pause_tenant, created_at)
		VALUES (?, ?, ?, ?)`+conflict, p.Topic, p.Group, p.Tenant, s.timeArg(s.now(p.Now)))
	if err != nil {
		return s.errorf("pause", err)
	}
	return nil
}

// PauseRemove is the stores' PauseRemove: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) PauseRemove(ctx context.Context, p outbox.PauseRemoveParams) (bool, error) {
	if err := p.Validate(); err != nil {
		return false, err
	}
	r, err := s.db.ExecContext(ctx, `DELETE FROM `+s.PausesTable()+` WHERE pause_topic = ? AND pause_grp = ? AND pause_tenant = ?`,
		p.Topic, p.Group, p.Tenant)
	if err != nil {
		return false, s.errorf("resume", err)
	}
	n, _ := r.RowsAffected()
	if n > 0 {
		s.Notify()
	}
	return n > 0, nil
}

// PauseList is the stores' PauseList: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) PauseList(ctx context.Context, _ outbox.PauseListParams) ([]outbox.Pause, error) {
	out, err := Pauses(ctx, s.db, s.PausesTable())
	if err != nil {
		return nil, s.errorf("pauses", err)
	}
	return out, nil
}

// Pauses reads every pause of the pauses table with q (the claim reads
// them in its transaction).
func Pauses(ctx context.Context, q Querier, table string) ([]outbox.Pause, error) {
	var out []outbox.Pause
	err := scanRows(ctx, q, `SELECT pause_topic, pause_grp, pause_tenant, created_at FROM `+table+
		` ORDER BY pause_topic, pause_grp, pause_tenant`, nil, func(r *sql.Rows) error {
		var p outbox.Pause
		var at Time
		if err := r.Scan(&p.Topic, &p.Group, &p.Tenant, &at); err != nil {
			return err
		}
		p.CreatedAt = at.T
		out = append(out, p)
		return nil
	})
	return out, err
}
