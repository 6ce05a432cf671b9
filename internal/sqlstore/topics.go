package sqlstore

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.PendingTopicLister = (*Store)(nil)

// MessagePendingTopics is the stores' MessagePendingTopics: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessagePendingTopics(ctx context.Context, p outbox.MessagePendingTopicsParams) ([]outbox.PendingTopic, error) {
	var out []outbox.PendingTopic
	// Excluded topics are left out (the processor passes the topics it
	// claims: their backlog would be most of the count).
	args := []any{s.syntax.Time(p.DueBefore.UTC())}
	exclude := ""
	if len(p.ExcludeTopics) > 0 {
		exclude = ` AND topic NOT IN (` + Placeholders(len(p.ExcludeTopics)) + `)`
		for _, t := range p.ExcludeTopics {
			args = append(args, t)
		}
	}
	err := scanRows(ctx, s.db, `SELECT topic, COUNT(*), MIN(next_attempt_at) FROM `+s.messages+
		` WHERE status = 'PENDING' AND next_attempt_at <= ?`+exclude+` GROUP BY topic ORDER BY topic`,
		args, func(rows *sql.Rows) error {
			var t outbox.PendingTopic
			var oldest Time
			if err := rows.Scan(&t.Topic, &t.Messages, &oldest); err != nil {
				return err
			}
			t.OldestDueAt = oldest.T
			out = append(out, t)
			return nil
		})
	if err != nil {
		return nil, s.errorf("pending topics", err)
	}
	return out, nil
}
