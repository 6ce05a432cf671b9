package postgres

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/outbox"
)

// Prune on the append-only path. A message finished by its group's marks
// keeps a PENDING row, so prune reads the marks rather than each row's
// state: per group, the newest done mark older than the cutoff says how far
// the group's messages were finished before it. The same pass sweeps the
// marks no read needs any more (older than that mark, and below every row
// that still takes its state from the marks), so the marks table grows with
// the live groups and what is kept, not with the history.

// logPruneGroups deletes, in the registry's groups of topic $3 ("" for
// all), up to $2 messages finished by their group's marks before $1 (a row
// still PENDING at or below the group's newest done mark older than $1, in
// seq order), with their history, and sweeps each group's marks older than
// that mark whose done is below the group's first row still PENDING after
// the delete.
const logPruneGroups = `WITH cut AS MATERIALIZED (
	SELECT g.tenant, g.topic, g.grp, k.mseq, k.done FROM {G} g CROSS JOIN LATERAL (
		SELECT k.mseq, k.done FROM {K} k
		WHERE k.gk = hashtextextended(g.tenant || chr(31) || g.topic || chr(31) || g.grp, 0) AND k.part = 0 AND k.tenant = g.tenant AND k.topic = g.topic AND k.grp = g.grp
			AND k.kind = 'done' AND k.at < $1
		ORDER BY k.gk, k.part, k.mseq DESC LIMIT 1) k
	WHERE $3 = '' OR g.topic = $3
), v AS MATERIALIZED (
	SELECT c.tenant, c.topic, c.grp, b.id, b.seq FROM cut c CROSS JOIN LATERAL (
		SELECT b.id, b.seq FROM {T} b
		WHERE b.tenant = c.tenant AND b.topic = c.topic AND b.grp = c.grp
			AND (b.status = 'PENDING' OR b.blocks_group) AND b.grp <> '' AND b.status = 'PENDING'
			AND b.seq <= c.done
		ORDER BY b.tenant, b.topic, b.grp, b.seq) b
	LIMIT $2
), del AS (
	DELETE FROM {T} m USING v WHERE m.id = v.id AND m.status = 'PENDING' RETURNING m.id
), del_att AS (
	DELETE FROM {A} a USING del WHERE a.message_id = del.id
), low AS MATERIALIZED (
	-- Per group, the first row still PENDING after the delete: the marks
	-- whose done is below it finish no row that reads them.
	SELECT c.tenant, c.topic, c.grp, c.mseq, p.seq AS low FROM cut c
	LEFT JOIN LATERAL (SELECT max(v.seq) AS upto FROM v
		WHERE v.tenant = c.tenant AND v.topic = c.topic AND v.grp = c.grp) d ON true
	LEFT JOIN LATERAL (SELECT b.seq FROM {T} b
		WHERE b.tenant = c.tenant AND b.topic = c.topic AND b.grp = c.grp
			AND (b.status = 'PENDING' OR b.blocks_group) AND b.grp <> '' AND b.status = 'PENDING'
			AND b.seq > coalesce(d.upto, 0)
		ORDER BY b.tenant, b.topic, b.grp, b.seq LIMIT 1) p ON true
), sweep AS (
	DELETE FROM {K} k USING low l
	WHERE k.gk = hashtextextended(l.tenant || chr(31) || l.topic || chr(31) || l.grp, 0) AND k.part = 0 AND k.tenant = l.tenant AND k.topic = l.topic AND k.grp = l.grp
		AND k.mseq < l.mseq AND (l.low IS NULL OR k.done < l.low)
)
SELECT count(*) FROM del`

// logPruneUnordered deletes up to $2 unordered messages of topic $3 (""
// for all) that a done mark finished before $1 and whose rows stayed
// PENDING, oldest mark first, with their history, and sweeps the marks of
// every unordered message such a mark finished (a row that left PENDING
// reads its own state).
const logPruneUnordered = `WITH k AS MATERIALIZED (
	SELECT k.tenant, k.topic, k.part FROM {K} k
	WHERE k.grp = '' AND k.part > 0 AND k.kind = 'done' AND k.done >= k.part AND k.at < $1
		AND ($3 = '' OR k.topic = $3)
	ORDER BY k.mseq
	LIMIT $2
), del AS (
	DELETE FROM {T} m USING k
	WHERE m.seq = k.part AND m.tenant = k.tenant AND m.topic = k.topic AND m.grp = '' AND m.status = 'PENDING'
	RETURNING m.id
), del_att AS (
	DELETE FROM {A} a USING del WHERE a.message_id = del.id
), sweep AS (
	DELETE FROM {K} x USING k WHERE x.gk = hashtextextended(k.tenant || chr(31) || k.topic || chr(31) || '', 0) AND x.part = k.part
		AND x.tenant = k.tenant AND x.topic = k.topic AND x.grp = ''
)
SELECT count(*) FROM del`

// logPrune is MessagePrune's delete on the append-only path: the rows whose
// own status is finished (a retry's dead letter, a cancel, a sent message
// with a provider ID, receipts) as on the default path, then, when SENT is
// pruned, the messages the marks finished.
func (s *Store) logPrune(ctx context.Context, before time.Time, limit int, sts []string, topic string) (int, error) {
	var total int
	err := s.logDurableTx(ctx, func(tx pgx.Tx) error {
		total = 0
		if err := tx.QueryRow(ctx, s.sql.prune, before, limit, sts, topic).Scan(&total); err != nil {
			return err
		}
		if !slices.Contains(sts, string(outbox.StatusSent)) {
			return nil
		}
		for _, stmt := range []string{s.lsql.pruneGroups, s.lsql.pruneUnordered} {
			if total >= limit {
				return nil
			}
			var n int
			if err := tx.QueryRow(ctx, stmt, before, limit-total, topic).Scan(&n); err != nil {
				return err
			}
			total += n
		}
		return nil
	})
	return total, err
}
