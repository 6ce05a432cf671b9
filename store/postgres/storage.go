package postgres

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

var _ outbox.StorageReporter = (*Store)(nil)

// storageTablesSQL reads the statistics of the store's tables ($1), those
// that exist, by their given names.
const storageTablesSQL = `SELECT t.name, coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
	greatest(s.last_vacuum, s.last_autovacuum)
FROM unnest($1::text[]) AS t(name)
JOIN pg_class c ON c.oid = to_regclass(t.name)
LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
ORDER BY t.name`

// storageHorizonSQL finds the oldest transaction ID that keeps VACUUM from
// removing dead row versions: a session's open transaction or snapshot
// (this one's excepted), a standby's feedback, a replication slot, a
// prepared transaction. Other roles' sessions show theirs only to a role
// with pg_read_all_stats.
const storageHorizonSQL = `SELECT coalesce(max(h.age), 0), coalesce((array_agg(h.holder ORDER BY h.age DESC))[1], '')
FROM (
	SELECT greatest(age(a.backend_xid), age(a.backend_xmin)) AS age,
		format('session %s (%s, application %L, user %L, transaction started %s)', a.pid, coalesce(a.state, 'unknown state'),
			a.application_name, a.usename, coalesce(to_char(a.xact_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'unknown')) AS holder
	FROM pg_stat_activity a
	WHERE a.pid <> pg_backend_pid() AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
	UNION ALL
	SELECT age(r.backend_xmin), format('standby %L (hot_standby_feedback)', r.application_name)
	FROM pg_stat_replication r WHERE r.backend_xmin IS NOT NULL
	UNION ALL
	SELECT age(l.xmin), format('replication slot %L', l.slot_name)
	FROM pg_replication_slots l WHERE l.xmin IS NOT NULL
	UNION ALL
	SELECT age(p.transaction), format('prepared transaction %L', p.gid)
	FROM pg_prepared_xacts p
) h`

// StorageStats implements outbox.StorageReporter: the statistics
// PostgreSQL keeps for the store's tables (pg_stat_all_tables: live and
// dead row estimates, the last vacuum), and the cleanup horizon of the
// database. With autovacuum working, a queue table's dead rows stay a
// fraction of its live ones (Migrate sets the messages table to be
// vacuumed after 1% of it changed); dead rows that keep growing, or a
// horizon thousands of transactions old, mean vacuum is off, starved or
// held back. The statistics are estimates, reported by each session at
// most once a second (up to 10 s when it is idle).
func (s *Store) StorageStats(ctx context.Context) (outbox.StorageStats, error) {
	var out outbox.StorageStats
	tables := []string{s.messages, s.attempts, s.inboxTable(), s.pauses}
	r, err := s.db.Query(ctx, storageTablesSQL, tables)
	if err != nil {
		return out, wrapErr("storage stats", err)
	}
	defer r.Close()
	for r.Next() {
		var t outbox.TableStorage
		var last *time.Time
		if err := r.Scan(&t.Name, &t.LiveRows, &t.DeadRows, &last); err != nil {
			return out, wrapErr("storage stats", err)
		}
		if last != nil {
			t.LastCleanup = last.UTC()
		}
		out.Tables = append(out.Tables, t)
	}
	if err := r.Err(); err != nil {
		return out, wrapErr("storage stats", err)
	}
	if err := s.db.QueryRow(ctx, storageHorizonSQL).Scan(&out.Horizon.AgeTransactions, &out.Horizon.Holder); err != nil {
		return out, wrapErr("storage horizon", err)
	}
	return out, nil
}
