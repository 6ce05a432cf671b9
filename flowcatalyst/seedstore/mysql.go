package seedstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/outbox"
)

// NewMySQL returns a Store over db, a MySQL 8 or MariaDB 10.6+ database
// holding seed 004's tables (the seed's DDL; see CreateTables). It does not
// touch the database.
//
// db must be opened with github.com/go-sql-driver/mysql with parseTime=true,
// loc=UTC and the session time zone '+00:00', so that the seed's TIMESTAMP
// columns read and compare in UTC; MySQLDSN adds these to a DSN.
//
// The behaviour is the PostgreSQL Store's (FIFO per message_group, NULL as
// the group "default", outcomes fenced by the claim, the database's NOW()),
// with these differences that follow from MySQL:
//
//   - a claim is one READ COMMITTED transaction of several statements: the
//     groups with PENDING rows (one index-only GROUP BY), then per group its
//     first rows by SELECT ... FOR UPDATE SKIP LOCKED, kept only when
//     nothing earlier in the group is unfinished, then one UPDATE and one
//     SELECT of the claimed rows (MySQL has no UPDATE ... RETURNING);
//   - a group's order is (created_at, id): TIMESTAMP has whole seconds on
//     MySQL, so rows of one second are ordered by id (TSIDs follow
//     creation);
//   - the seed's TIMESTAMP has whole seconds on MySQL, so processed_at
//     (the claim fence and the retry time) is kept to the second: a
//     processing timeout must be at least a second, and a retry delay is
//     rounded to the second by the server;
//   - message_group compares with the column's collation (usually
//     case-insensitive): groups that the collation deems equal are
//     claimed as one FIFO group (ordered together, never reordered);
//   - statements that change rows also set created_at to itself, so a
//     created_at column declared with ON UPDATE CURRENT_TIMESTAMP (what
//     MySQL gives the seed's DDL when explicit_defaults_for_timestamp is
//     off) keeps its value, and with it the group's order.
func NewMySQL(db DB, opts Options) (*Store, error) { return newStore(db, opts, dialectMySQL) }

// MySQLDSN returns dsn (a github.com/go-sql-driver/mysql DSN such as
// "user:pass@tcp(host:3306)/app") with what NewMySQL needs: parseTime=true,
// loc=UTC and time_zone '+00:00'. The error does not repeat the DSN.
func MySQLDSN(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("seedstore: not a MySQL DSN (user:pass@tcp(host:3306)/db): %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	return cfg.FormatDSN(), nil
}

// mysqlStatements are the MySQL statements that have no PostgreSQL
// counterpart of the same shape.
type mysqlStatements struct {
	heads, busy                    string
	cand, candNull                 string
	before, beforeNull             string
	unordered                      string
	recover, recoverDead, recoverN string
	ddl                            string
}

// buildMySQLStatements returns the statements for table t (already quoted
// with backticks).
func buildMySQLStatements(t string) (statements, mysqlStatements) {
	q := func(s string) string {
		return strings.NewReplacer("{T}", t, "{COLS}", columns).Replace(s)
	}
	// due is whether a PENDING row may be sent now (processed_at of a
	// PENDING row is its retry time).
	const due = `(processed_at IS NULL OR processed_at <= NOW())`
	return statements{
			insert: q(`INSERT INTO {T} (id, type, message_group, payload, status, retry_count, created_at, processed_at)
VALUES (?, ?, ?, ?, 'PENDING', 0, ?, ?)`),
			get: q(`SELECT {COLS} FROM {T} WHERE id = ?`),
			list: q(`SELECT {COLS} FROM {T}
WHERE (? = '' OR id > ?) AND (? = '' OR status = ?) AND (? = '' OR message_group = ?)
ORDER BY id
LIMIT ?`),
			count:   q(`SELECT status, count(*) FROM {T} GROUP BY status`),
			requeue: q(`UPDATE {T} SET status = 'PENDING', retry_count = 0, processed_at = NULL, error_message = NULL, created_at = created_at WHERE id = ? AND status = 'FAILED'`),
			prune: q(`DELETE FROM {T}
WHERE status IN ('COMPLETED', 'FAILED') AND processed_at < ?
ORDER BY processed_at
LIMIT ?`),
		}, mysqlStatements{
			// heads reads only the seed's index (status, message_group,
			// created_at): one entry per group with PENDING rows.
			heads: q(`SELECT message_group, MIN(created_at) FROM {T} WHERE status = 'PENDING' GROUP BY message_group`),
			busy:  q(`SELECT DISTINCT message_group FROM {T} WHERE status = 'PROCESSING'`),
			cand: q(`SELECT id, created_at, ` + due + ` FROM {T}
WHERE status = 'PENDING' AND message_group = ?
ORDER BY created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`),
			candNull: q(`SELECT id, created_at, ` + due + ` FROM {T}
WHERE status = 'PENDING' AND message_group IS NULL
ORDER BY created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`),
			// before counts the group's unfinished rows ordered before the
			// row with id ? by (created_at, id): exactly the claim's own
			// rows when the claim starts at the group's head. The id breaks
			// ties because TIMESTAMP has whole seconds on MySQL, so rows
			// written in the same second are common (TSIDs follow creation).
			before: q(`SELECT COUNT(*) FROM {T} b JOIN (SELECT created_at, id FROM {T} WHERE id = ?) l
WHERE b.status IN ('PENDING', 'PROCESSING') AND b.message_group = ?
	AND (b.created_at < l.created_at OR (b.created_at = l.created_at AND b.id < l.id))`),
			beforeNull: q(`SELECT COUNT(*) FROM {T} b JOIN (SELECT created_at, id FROM {T} WHERE id = ?) l
WHERE b.status IN ('PENDING', 'PROCESSING') AND b.message_group IS NULL
	AND (b.created_at < l.created_at OR (b.created_at = l.created_at AND b.id < l.id))`),
			unordered: q(`SELECT id FROM {T}
WHERE status = 'PENDING' AND message_group IS NULL AND ` + due + `
ORDER BY created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`),
			// recover: ? the processing timeout in microseconds.
			recover: q(`UPDATE {T} SET status = 'PENDING', processed_at = NULL, created_at = created_at
WHERE status = 'PROCESSING' AND (processed_at IS NULL OR processed_at < NOW() - INTERVAL ? MICROSECOND)`),
			// recoverDead and recoverN: Options.RecoveryCountsAttempt; ?
			// the error, the most attempts, the timeout.
			recoverDead: q(`UPDATE {T} SET status = 'FAILED', processed_at = NOW(), error_message = ?, created_at = created_at
WHERE status = 'PROCESSING' AND retry_count + 1 >= ?
	AND (processed_at IS NULL OR processed_at < NOW() - INTERVAL ? MICROSECOND)`),
			recoverN: q(`UPDATE {T} SET status = 'PENDING', processed_at = NULL, retry_count = retry_count + 1, created_at = created_at
WHERE status = 'PROCESSING'
	AND (processed_at IS NULL OR processed_at < NOW() - INTERVAL ? MICROSECOND)`),
			// ddl is seed 004's table with what MySQL needs to keep its
			// meaning whatever explicit_defaults_for_timestamp says:
			// processed_at NULL, created_at not updated automatically.
			ddl: q(`CREATE TABLE IF NOT EXISTS {T} (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255) NULL,
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    processed_at TIMESTAMP NULL DEFAULT NULL,
    error_message TEXT,
    INDEX {IDX} (status, message_group, created_at)
)`),
		}
}

func (s *Store) createTablesMySQL(ctx context.Context) error {
	for _, t := range s.tables {
		name := t.raw
		if i := strings.LastIndex(name, "."); i >= 0 {
			name = name[i+1:]
		}
		ddl := strings.Replace(t.my.ddl, "{IDX}", "`idx_"+name+"_status`", 1)
		if _, err := s.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("seedstore: create %s: %w", t.raw, err)
		}
	}
	return nil
}

// placeholders returns "?, ?, ..." for n values.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func anys(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// mysqlRetries is how many times a claim or an outcome write is run again
// after the server chose its transaction as a deadlock victim (error 1213)
// or one of its lock waits timed out (1205). Either way the transaction is
// rolled back whole (the store rolls back after a failed statement), so
// nothing of it was applied and running it again is safe.
const mysqlRetries = 5

// retryMySQL runs fn, and again after a deadlock or a lock wait timeout,
// up to mysqlRetries times, with a short growing pause between tries.
func retryMySQL[T any](ctx context.Context, s *Store, op string, fn func() (T, error)) (T, error) {
	for try := 0; ; try++ {
		v, err := fn()
		if err == nil || !mysqlRetryable(err) || try >= mysqlRetries {
			return v, err
		}
		s.log.DebugContext(ctx, "seedstore: retrying a MySQL transaction", "op", op, "err", err, "try", try+1)
		t := time.NewTimer(time.Duration(try+1) * 5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// mysqlRetryable reports a deadlock (1213) or a lock wait timeout (1205).
func mysqlRetryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// claimMySQL claims up to limit rows of t in one transaction, run again
// after a deadlock or a lock wait timeout; see NewMySQL.
func (s *Store) claimMySQL(ctx context.Context, t *table, limit int, owner string) ([]outbox.Message, error) {
	return retryMySQL(ctx, s, "claim", func() ([]outbox.Message, error) { return s.tryClaimMySQL(ctx, t, limit, owner) })
}

func (s *Store) tryClaimMySQL(ctx context.Context, t *table, limit int, owner string) ([]outbox.Message, error) {
	fail := func(err error) ([]outbox.Message, error) {
		return nil, fmt.Errorf("seedstore: claim %s: %w", t.raw, err)
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fail(err)
	}
	defer func() { _ = tx.Rollback() }()

	type head struct {
		g     sql.NullString
		first time.Time
	}
	var heads []head
	busy := map[string]bool{}
	nullBusy := false
	if err := queryEach(ctx, tx, t.my.busy, nil, func(r *sql.Rows) error {
		var g sql.NullString
		if err := r.Scan(&g); err != nil {
			return err
		}
		if g.Valid {
			busy[g.String] = true
		} else {
			nullBusy = true
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := queryEach(ctx, tx, t.my.heads, nil, func(r *sql.Rows) error {
		var h head
		if err := r.Scan(&h.g, &h.first); err != nil {
			return err
		}
		// A group with a row in flight waits; NULL rows sent unordered are
		// claimed below.
		if (h.g.Valid && !busy[h.g.String]) || (!h.g.Valid && !nullBusy && !s.unorderedNull) {
			heads = append(heads, h)
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	// The groups with the oldest heads first.
	sort.Slice(heads, func(i, j int) bool {
		if !heads[i].first.Equal(heads[j].first) {
			return heads[i].first.Before(heads[j].first)
		}
		return heads[i].g.String < heads[j].g.String
	})

	var ids []string
	for _, h := range heads {
		if len(ids) >= limit {
			break
		}
		n := min(limit-len(ids), s.chunk)
		stmt, args := t.my.cand, []any{h.g.String, n}
		if !h.g.Valid {
			stmt, args = t.my.candNull, []any{n}
		}
		type cand struct {
			id      string
			created time.Time
		}
		var kept []cand
		stop := false
		if err := queryEach(ctx, tx, stmt, args, func(r *sql.Rows) error {
			var c cand
			var due bool
			if err := r.Scan(&c.id, &c.created, &due); err != nil {
				return err
			}
			// A group's rows up to its first row not yet due.
			if stop = stop || !due; !stop {
				kept = append(kept, c)
			}
			return nil
		}); err != nil {
			return fail(err)
		}
		if len(kept) == 0 {
			continue
		}
		// Keep the group's rows only when those ordered before the last one
		// are exactly its unfinished rows ordered before it: nothing
		// earlier is held by another claimer (skipped), PROCESSING or
		// waiting for a retry.
		last := kept[len(kept)-1]
		want := len(kept) - 1
		stmt, args = t.my.before, []any{last.id, h.g.String}
		if !h.g.Valid {
			stmt, args = t.my.beforeNull, []any{last.id}
		}
		var got int
		if err := tx.QueryRowContext(ctx, stmt, args...).Scan(&got); err != nil {
			return fail(err)
		}
		if got != want {
			continue
		}
		for _, c := range kept {
			ids = append(ids, c.id)
		}
	}
	if s.unorderedNull && len(ids) < limit {
		if err := queryEach(ctx, tx, t.my.unordered, []any{limit - len(ids)}, func(r *sql.Rows) error {
			var id string
			if err := r.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return nil
		}); err != nil {
			return fail(err)
		}
	}
	if len(ids) == 0 {
		return nil, tx.Commit()
	}
	in := placeholders(len(ids))
	// Every claimed row is row-locked by this transaction, so still PENDING.
	if _, err := tx.ExecContext(ctx, `UPDATE `+t.name+` SET status = 'PROCESSING', processed_at = NOW(), created_at = created_at
WHERE id IN (`+in+`)`, anys(ids)...); err != nil {
		return fail(err)
	}
	var out []outbox.Message
	var claimed []time.Time
	if err := queryEach(ctx, tx, `SELECT `+columns+` FROM `+t.name+` WHERE id IN (`+in+`) ORDER BY created_at, id`, anys(ids), func(r *sql.Rows) error {
		var rw row
		if err := r.Scan(rw.dest()...); err != nil {
			return err
		}
		m := s.message(&rw, t.topic)
		m.ClaimedBy = owner
		out = append(out, m)
		claimed = append(claimed, rw.processedAt.Time)
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	s.remember(t, out, claimed)
	return out, nil
}

// queryEach runs stmt in tx and calls each for every row.
func queryEach(ctx context.Context, tx *sql.Tx, stmt string, args []any, each func(*sql.Rows) error) error {
	rows, err := tx.QueryContext(ctx, stmt, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// finishMySQL applies outcomes in one transaction, run again after a
// deadlock or a lock wait timeout: it locks the rows, keeps the outcomes
// whose row is still PROCESSING with the processed_at of this Store's
// claim (the fence), and returns the ids of the others.
func (s *Store) finishMySQL(ctx context.Context, work map[*table]*perTable) ([]string, error) {
	return retryMySQL(ctx, s, "finish", func() ([]string, error) { return s.tryFinishMySQL(ctx, work) })
}

func (s *Store) tryFinishMySQL(ctx context.Context, work map[*table]*perTable) ([]string, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("seedstore: finish: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var lost []string
	for _, t := range s.tables {
		w := work[t]
		if w == nil {
			continue
		}
		if err := s.finishTableMySQL(ctx, tx, t, w, &lost); err != nil {
			return nil, fmt.Errorf("seedstore: finish %s: %w", t.raw, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("seedstore: finish: %w", err)
	}
	return lost, nil
}

func (s *Store) finishTableMySQL(ctx context.Context, tx *sql.Tx, t *table, w *perTable, lost *[]string) error {
	var all []string
	for _, b := range []*batch{&w.sent, &w.retry, &w.dead, &w.released} {
		all = append(all, b.ids...)
	}
	type current struct {
		status string
		at     sql.NullTime
	}
	cur := map[string]current{}
	if err := queryEach(ctx, tx, `SELECT id, status, processed_at FROM `+t.name+` WHERE id IN (`+placeholders(len(all))+`) FOR UPDATE`, anys(all), func(r *sql.Rows) error {
		var id string
		var c current
		if err := r.Scan(&id, &c.status, &c.at); err != nil {
			return err
		}
		cur[id] = c
		return nil
	}); err != nil {
		return err
	}
	// held reports whether outcome i of b still holds its lease.
	held := func(b *batch, i int) bool {
		c, ok := cur[b.ids[i]]
		if ok && c.status == StatusProcessing && c.at.Valid && c.at.Time.Equal(b.claimed[i]) {
			return true
		}
		*lost = append(*lost, b.ids[i])
		return false
	}
	var sent []string
	for i := range w.sent.ids {
		if held(&w.sent, i) {
			sent = append(sent, w.sent.ids[i])
		}
	}
	if len(sent) > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE `+t.name+` SET status = 'COMPLETED', processed_at = NOW(), error_message = NULL, created_at = created_at
WHERE id IN (`+placeholders(len(sent))+`)`, anys(sent)...); err != nil {
			return err
		}
	}
	// Outcomes with the same values (typically a failed request's items)
	// are written by one statement.
	type change struct {
		next  int64
		retry int
		msg   string
	}
	var order []change
	same := map[change][]string{}
	add := func(c change, id string) {
		if same[c] == nil {
			order = append(order, c)
		}
		same[c] = append(same[c], id)
	}
	for i, id := range w.retry.ids {
		if held(&w.retry, i) {
			add(change{w.retry.next[i], w.retry.retry[i], w.retry.msgs[i]}, id)
		}
	}
	for _, c := range order {
		ids := same[c]
		if _, err := tx.ExecContext(ctx, `UPDATE `+t.name+` SET status = 'PENDING', processed_at = NOW() + INTERVAL ? MICROSECOND,
	retry_count = ?, error_message = ?, created_at = created_at WHERE id IN (`+placeholders(len(ids))+`)`,
			append([]any{c.next, c.retry, c.msg}, anys(ids)...)...); err != nil {
			return err
		}
	}
	order, same = nil, map[change][]string{}
	for i, id := range w.dead.ids {
		if held(&w.dead, i) {
			add(change{msg: w.dead.msgs[i]}, id)
		}
	}
	for _, c := range order {
		ids := same[c]
		if _, err := tx.ExecContext(ctx, `UPDATE `+t.name+` SET status = 'FAILED', processed_at = NOW(), error_message = ?, created_at = created_at
WHERE id IN (`+placeholders(len(ids))+`)`, append([]any{c.msg}, anys(ids)...)...); err != nil {
			return err
		}
	}
	for i, id := range w.released.ids {
		if !held(&w.released, i) {
			continue
		}
		var err error
		if d := w.released.deferTo[i]; d != nil {
			_, err = tx.ExecContext(ctx, `UPDATE `+t.name+` SET status = 'PENDING', processed_at = NOW() + INTERVAL ? MICROSECOND, created_at = created_at WHERE id = ?`, *d, id)
		} else {
			_, err = tx.ExecContext(ctx, `UPDATE `+t.name+` SET status = 'PENDING', processed_at = NULL, created_at = created_at WHERE id = ?`, id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// recoverMySQL puts t's stuck PROCESSING rows back to PENDING (or, with
// Options.RecoveryCountsAttempt, counts the lost attempt and fails the rows
// that used their last one).
func (s *Store) recoverMySQL(ctx context.Context, t *table, timeout int64, maxAttempts int) (recovered, dead int, err error) {
	if !s.recoveryCounts {
		res, err := s.db.ExecContext(ctx, t.my.recover, timeout)
		if err != nil {
			return 0, 0, err
		}
		n, _ := res.RowsAffected()
		return int(n), 0, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback() }()
	msg := errorText(outbox.ErrorInfo{Code: "lease_expired", Message: "the processor did not finish the attempt in time"})
	res, err := tx.ExecContext(ctx, t.my.recoverDead, msg, maxAttempts, timeout)
	if err != nil {
		return 0, 0, err
	}
	d, _ := res.RowsAffected()
	res, err = tx.ExecContext(ctx, t.my.recoverN, timeout)
	if err != nil {
		return 0, 0, err
	}
	r, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, 0, err
	}
	return int(r), int(d), nil
}
