package whatsapp

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Dialect is the SQL dialect of an SQLState.
type Dialect string

// The dialects SQLState speaks.
const (
	// DialectPostgres: PostgreSQL (e.g. through pgx's stdlib driver).
	DialectPostgres Dialect = "postgres"
	// DialectMySQL: MySQL 8 and MariaDB 10.6+ (go-sql-driver/mysql).
	DialectMySQL Dialect = "mysql"
	// DialectSQLite: SQLite (modernc.org/sqlite); set a busy timeout.
	DialectSQLite Dialect = "sqlite"
)

// SQLOptions configures an SQLState.
type SQLOptions struct {
	// Dialect is required.
	Dialect Dialect
	// TablePrefix starts the three table names (…session_window, …quota,
	// …inbound_seen). It may be schema-qualified ("app.wa_"). Defaults to
	// "outboxkit_whatsapp_".
	TablePrefix string
	QuotaOptions
}

// SQLState is a State in a SQL database through database/sql (PostgreSQL,
// MySQL/MariaDB or SQLite). Times are stored as Unix milliseconds. Quota
// counting is one conditional UPDATE per call (atomic under concurrency).
// Call Migrate once before use.
type SQLState struct {
	db   *sql.DB
	d    Dialect
	opts QuotaOptions

	window, quota, seen string
}

var tablePrefixRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// NewSQLState returns an SQLState over db.
func NewSQLState(db *sql.DB, opts SQLOptions) (*SQLState, error) {
	switch opts.Dialect {
	case DialectPostgres, DialectMySQL, DialectSQLite:
	default:
		return nil, fmt.Errorf("whatsapp: unknown SQL dialect %q", opts.Dialect)
	}
	if db == nil {
		return nil, errors.New("whatsapp: nil *sql.DB")
	}
	p := opts.TablePrefix
	if p == "" {
		p = "outboxkit_whatsapp_"
	}
	if !tablePrefixRE.MatchString(p + "x") {
		return nil, fmt.Errorf("whatsapp: invalid table prefix %q", p)
	}
	return &SQLState{
		db: db, d: opts.Dialect, opts: opts.QuotaOptions.WithDefaults(),
		window: p + "session_window", quota: p + "quota", seen: p + "inbound_seen",
	}, nil
}

// rebind turns ? placeholders into $n for PostgreSQL.
func (s *SQLState) rebind(q string) string {
	if s.d != DialectPostgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *SQLState) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return s.db.ExecContext(ctx, s.rebind(q), args...)
}

// Migrate creates the tables if they do not exist. It is idempotent and may
// run from several replicas at once (on PostgreSQL it takes an advisory
// lock).
func (s *SQLState) Migrate(ctx context.Context) error {
	tenant, key := "VARCHAR(255)", "VARCHAR(255)"
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + s.window + ` (
			tenant ` + tenant + ` NOT NULL,
			phone VARCHAR(32) NOT NULL,
			last_inbound_ms BIGINT NOT NULL,
			expires_ms BIGINT NOT NULL,
			PRIMARY KEY (tenant, phone))`,
		`CREATE INDEX IF NOT EXISTS ` + idxName(s.window, "expires") + ` ON ` + s.window + ` (expires_ms)`,
		`CREATE TABLE IF NOT EXISTS ` + s.quota + ` (
			tenant ` + tenant + ` NOT NULL PRIMARY KEY,
			window_start_ms BIGINT NOT NULL DEFAULT 0,
			sent BIGINT NOT NULL DEFAULT 0,
			quota_limit BIGINT NOT NULL DEFAULT 0,
			throttled_until_ms BIGINT NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS ` + s.seen + ` (
			tenant ` + tenant + ` NOT NULL,
			message_id ` + key + ` NOT NULL,
			expires_ms BIGINT NOT NULL,
			PRIMARY KEY (tenant, message_id))`,
	}
	if s.d == DialectMySQL {
		// MySQL has no CREATE INDEX IF NOT EXISTS (MariaDB has); an inline
		// index works on both.
		stmts[0] = strings.TrimSuffix(stmts[0], ")") + `, INDEX ` + idxName(s.window, "expires") + ` (expires_ms))`
		stmts = append(stmts[:1], stmts[2:]...)
	}
	if s.d != DialectPostgres {
		for _, q := range stmts {
			if _, err := s.db.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("whatsapp: migrate: %w", err)
			}
		}
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("whatsapp: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "outboxkit_whatsapp_migrate:"+s.quota); err != nil {
		return fmt.Errorf("whatsapp: migrate: %w", err)
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("whatsapp: migrate: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("whatsapp: migrate: %w", err)
	}
	return nil
}

// idxName names an index after its table without a schema qualifier.
func idxName(table, suffix string) string {
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		table = table[i+1:]
	}
	return table + "_" + suffix + "_idx"
}

func (s *SQLState) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("whatsapp: sql %s: %w", op, err)
}

// upsertIgnore returns the dialect's "insert this row unless its key
// exists" statement.
func (s *SQLState) insertIgnore(table, cols, vals string) string {
	if s.d == DialectMySQL {
		return `INSERT IGNORE INTO ` + table + ` (` + cols + `) VALUES (` + vals + `)`
	}
	return `INSERT INTO ` + table + ` (` + cols + `) VALUES (` + vals + `) ON CONFLICT DO NOTHING`
}

// WindowTouch implements WindowStore.
func (s *SQLState) WindowTouch(ctx context.Context, tenant, phone string, at time.Time) error {
	ms := at.UnixMilli()
	exp := at.Add(SessionWindow).UnixMilli()
	var q string
	if s.d == DialectMySQL {
		q = `INSERT INTO ` + s.window + ` (tenant, phone, last_inbound_ms, expires_ms) VALUES (?, ?, ?, ?)
			ON DUPLICATE KEY UPDATE
			expires_ms = CASE WHEN VALUES(last_inbound_ms) > last_inbound_ms THEN VALUES(expires_ms) ELSE expires_ms END,
			last_inbound_ms = CASE WHEN VALUES(last_inbound_ms) > last_inbound_ms THEN VALUES(last_inbound_ms) ELSE last_inbound_ms END`
	} else {
		q = `INSERT INTO ` + s.window + ` AS w (tenant, phone, last_inbound_ms, expires_ms) VALUES (?, ?, ?, ?)
			ON CONFLICT (tenant, phone) DO UPDATE SET
			last_inbound_ms = excluded.last_inbound_ms, expires_ms = excluded.expires_ms
			WHERE excluded.last_inbound_ms > w.last_inbound_ms`
	}
	_, err := s.exec(ctx, q, tenant, phone, ms, exp)
	return s.wrap("window touch", err)
}

// WindowGet implements WindowStore.
func (s *SQLState) WindowGet(ctx context.Context, tenant, phone string) (Window, bool, error) {
	var ms int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT last_inbound_ms FROM `+s.window+` WHERE tenant = ? AND phone = ?`), tenant, phone).Scan(&ms)
	if errors.Is(err, sql.ErrNoRows) {
		return Window{}, false, nil
	}
	if err != nil {
		return Window{}, false, s.wrap("window get", err)
	}
	at := msTime(ms)
	return Window{Tenant: tenant, Phone: phone, LastInboundAt: at, ExpiresAt: at.Add(SessionWindow)}, true, nil
}

// WindowCleanup implements WindowStore: it deletes expired windows and
// expired inbound message IDs, and returns the number of windows deleted.
func (s *SQLState) WindowCleanup(ctx context.Context, now time.Time) (int, error) {
	res, err := s.exec(ctx, `DELETE FROM `+s.window+` WHERE expires_ms <= ?`, now.UnixMilli())
	if err != nil {
		return 0, s.wrap("window cleanup", err)
	}
	n, _ := res.RowsAffected()
	if _, err := s.exec(ctx, `DELETE FROM `+s.seen+` WHERE expires_ms <= ?`, now.UnixMilli()); err != nil {
		return int(n), s.wrap("dedup cleanup", err)
	}
	return int(n), nil
}

func (s *SQLState) ensureQuotaRow(ctx context.Context, tenant string) error {
	_, err := s.exec(ctx, s.insertIgnore(s.quota, "tenant", "?"), tenant)
	return s.wrap("quota row", err)
}

// QuotaConsume implements QuotaStore with one conditional UPDATE: it counts
// the message only while the tenant is not throttled and, after resetting
// an ended window, under its limit.
func (s *SQLState) QuotaConsume(ctx context.Context, tenant string, now time.Time) (QuotaStatus, bool, error) {
	if err := s.ensureQuotaRow(ctx, tenant); err != nil {
		return QuotaStatus{}, false, err
	}
	nowMS := now.UnixMilli()
	cutoff := nowMS - s.opts.Window.Milliseconds() // a window started at or before cutoff has ended
	// The SET list assigns sent before window_start_ms: MySQL evaluates
	// assignments left to right with the updated values.
	q := `UPDATE ` + s.quota + ` SET
		sent = CASE WHEN window_start_ms <= ? THEN 1 ELSE sent + 1 END,
		window_start_ms = CASE WHEN window_start_ms <= ? THEN ? ELSE window_start_ms END
		WHERE tenant = ? AND throttled_until_ms <= ?
		AND (CASE WHEN window_start_ms <= ? THEN 0 ELSE sent END) < (CASE WHEN quota_limit > 0 THEN quota_limit ELSE ? END)`
	res, err := s.exec(ctx, q, cutoff, cutoff, nowMS, tenant, nowMS, cutoff, s.opts.DefaultLimit)
	if err != nil {
		return QuotaStatus{}, false, s.wrap("quota consume", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return QuotaStatus{}, false, s.wrap("quota consume", err)
	}
	st, err := s.QuotaGet(ctx, tenant, now)
	return st, n == 1, err
}

// QuotaGet implements QuotaStore.
func (s *SQLState) QuotaGet(ctx context.Context, tenant string, now time.Time) (QuotaStatus, error) {
	var start, sent, limit, thr int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT window_start_ms, sent, quota_limit, throttled_until_ms FROM `+s.quota+` WHERE tenant = ?`), tenant).Scan(&start, &sent, &limit, &thr)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return QuotaStatus{}, s.wrap("quota get", err)
	}
	if limit <= 0 {
		limit = s.opts.DefaultLimit
	}
	var reset time.Time
	if start > 0 {
		reset = msTime(start).Add(s.opts.Window)
		if !now.Before(reset) {
			sent, reset = 0, time.Time{}
		}
	}
	return NewQuotaStatus(sent, limit, reset, msTime(thr), now), nil
}

// QuotaSetLimit implements QuotaStore.
func (s *SQLState) QuotaSetLimit(ctx context.Context, tenant string, limit int64) error {
	if limit < 0 {
		return errors.New("whatsapp: negative quota limit")
	}
	if err := s.ensureQuotaRow(ctx, tenant); err != nil {
		return err
	}
	_, err := s.exec(ctx, `UPDATE `+s.quota+` SET quota_limit = ? WHERE tenant = ?`, limit, tenant)
	return s.wrap("quota set limit", err)
}

// QuotaThrottle implements QuotaStore.
func (s *SQLState) QuotaThrottle(ctx context.Context, tenant string, until, _ time.Time) error {
	if err := s.ensureQuotaRow(ctx, tenant); err != nil {
		return err
	}
	_, err := s.exec(ctx, `UPDATE `+s.quota+` SET throttled_until_ms = ? WHERE tenant = ? AND throttled_until_ms < ?`, until.UnixMilli(), tenant, until.UnixMilli())
	return s.wrap("quota throttle", err)
}

// InboundClaim implements Deduper. An expired entry is claimed again.
func (s *SQLState) InboundClaim(ctx context.Context, tenant, id string, now time.Time) (bool, error) {
	exp := now.Add(s.opts.DedupTTL).UnixMilli()
	res, err := s.exec(ctx, s.insertIgnore(s.seen, "tenant, message_id, expires_ms", "?, ?, ?"), tenant, id, exp)
	if err != nil {
		return false, s.wrap("inbound claim", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return true, nil
	}
	res, err = s.exec(ctx, `UPDATE `+s.seen+` SET expires_ms = ? WHERE tenant = ? AND message_id = ? AND expires_ms <= ?`, exp, tenant, id, now.UnixMilli())
	if err != nil {
		return false, s.wrap("inbound claim", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// InboundRelease implements Deduper.
func (s *SQLState) InboundRelease(ctx context.Context, tenant, id string) error {
	_, err := s.exec(ctx, `DELETE FROM `+s.seen+` WHERE tenant = ? AND message_id = ?`, tenant, id)
	return s.wrap("inbound release", err)
}

var _ State = (*SQLState)(nil)
