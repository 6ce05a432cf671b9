package postgres

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.PendingTopicLister = (*Store)(nil)

// MessagePendingTopics implements outbox.PendingTopicLister: the topics with
// PENDING messages due at or before p.DueBefore, across tenants. The
// processor uses it to report topics nobody publishes.
func (s *Store) MessagePendingTopics(ctx context.Context, p outbox.MessagePendingTopicsParams) ([]outbox.PendingTopic, error) {
	rows, err := s.db.Query(ctx, `SELECT topic, count(*), min(next_attempt_at) FROM `+s.messages+
		` WHERE status = 'PENDING' AND next_attempt_at <= $1 GROUP BY topic ORDER BY topic`, p.DueBefore)
	if err != nil {
		return nil, wrapErr("pending topics", err)
	}
	defer rows.Close()
	var out []outbox.PendingTopic
	for rows.Next() {
		var t outbox.PendingTopic
		var oldest time.Time
		if err := rows.Scan(&t.Topic, &t.Messages, &oldest); err != nil {
			return nil, wrapErr("pending topics", err)
		}
		t.OldestDueAt = oldest.UTC()
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, wrapErr("pending topics", err)
	}
	return out, nil
}
