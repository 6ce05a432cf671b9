package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.PendingTopicLister = (*Store)(nil)

// pendingTopicsSQL counts the PENDING messages due at or before $1 by
// topic, leaving out the topics in $2 without reading their messages (the
// processor runs it every RecoveryInterval, and a plain count read every
// message of the table, history included). pairs visits each (tenant,
// topic) with waiting ordered messages in a loose scan of the group
// index (one descent each); the messages of a pair whose topic is not left
// out are counted in the same index. Unordered messages are read from the
// unordered claim index, due ones only.
const pendingTopicsSQL = `WITH RECURSIVE pairs AS (
	(SELECT m.tenant, m.topic FROM {T} m
	WHERE (m.status = 'PENDING' OR m.blocks_group) AND m.grp <> ''
	ORDER BY m.tenant, m.topic
	LIMIT 1)
	UNION ALL
	SELECT n.tenant, n.topic FROM pairs p CROSS JOIN LATERAL (
		SELECT m.tenant, m.topic FROM {T} m
		WHERE (m.status = 'PENDING' OR m.blocks_group) AND m.grp <> ''
			AND (m.tenant, m.topic) > (p.tenant, p.topic)
		ORDER BY m.tenant, m.topic
		LIMIT 1
	) n
)
SELECT topic, sum(n)::bigint, min(oldest) FROM (
	SELECT p.topic, c.n, c.oldest FROM pairs p CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(m.next_attempt_at) AS oldest FROM {T} m
		WHERE m.tenant = p.tenant AND m.topic = p.topic
			AND (m.status = 'PENDING' OR m.blocks_group) AND m.grp <> ''
			AND m.status = 'PENDING' AND m.next_attempt_at <= $1
	) c
	WHERE p.topic <> ALL($2::text[]) AND c.n > 0
	UNION ALL
	SELECT topic, count(*), min(next_attempt_at) FROM {T}
	WHERE status = 'PENDING' AND grp = '' AND next_attempt_at <= $1 AND topic <> ALL($2::text[])
	GROUP BY topic
) x
GROUP BY topic
ORDER BY topic`

// MessagePendingTopics implements outbox.PendingTopicLister: the topics with
// PENDING messages due at or before p.DueBefore, across tenants, but those
// in p.ExcludeTopics, whose messages it does not read. The processor uses
// it to report topics nobody publishes.
func (s *Store) MessagePendingTopics(ctx context.Context, p outbox.MessagePendingTopicsParams) ([]outbox.PendingTopic, error) {
	exclude := p.ExcludeTopics
	if exclude == nil {
		exclude = []string{}
	}
	var out []outbox.PendingTopic
	err := s.planned(ctx, s.reads().pendingTopics, []any{p.DueBefore, exclude}, func(r pgx.Rows) error {
		var t outbox.PendingTopic
		var oldest time.Time
		if err := r.Scan(&t.Topic, &t.Messages, &oldest); err != nil {
			return err
		}
		t.OldestDueAt = oldest.UTC()
		out = append(out, t)
		return nil
	})
	if err != nil {
		return nil, wrapErr("pending topics", err)
	}
	return out, nil
}
