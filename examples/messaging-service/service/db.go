package service

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// dialect holds what differs between the three databases for the service's
// own tables: placeholders, column types and the audit triggers.
type dialect struct {
	name string
	// outboxTable is the outbox store's messages table (triggers attach to it).
	outboxTable string
}

// rebind turns ? placeholders into $1, $2, ... for PostgreSQL.
func (d dialect) rebind(q string) string {
	if d.name != "postgres" {
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

// micros is the service tables' time format: Unix microseconds, UTC, in
// every dialect (the triggers convert the store's own timestamps to it).
func micros(t time.Time) int64 { return t.UTC().UnixMicro() }

func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// schema returns the DDL of the service's tables and triggers, each
// statement idempotent, so every start can run it.
func (d dialect) schema() []string {
	key := "VARCHAR(255)"
	text := "TEXT"
	autoID := "id INTEGER PRIMARY KEY AUTOINCREMENT"
	switch d.name {
	case "postgres":
		autoID = "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
	case "mysql":
		key = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
		text = "MEDIUMTEXT CHARACTER SET utf8mb4"
		autoID = "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"
	}
	msgID := key
	if d.name == "mysql" {
		// The outbox store keeps IDs as VARBINARY; the same type keeps the
		// triggers' join on the index.
		msgID = "VARBINARY(255)"
	}
	r := strings.NewReplacer("{key}", key, "{text}", text, "{autoid}", autoID, "{msgid}", msgID, "{subject}", d.subjectType())
	tables := []string{
		`CREATE TABLE IF NOT EXISTS msgsvc_api_keys (
			key_hash   CHAR(64) NOT NULL PRIMARY KEY,
			org_id     {key} NOT NULL,
			created_at BIGINT NOT NULL)`,
		// One row per outbound message: what the API knows about it beyond the
		// outbox row (dossier, channel, recipient, template).
		`CREATE TABLE IF NOT EXISTS msgsvc_messages (
			id              {msgid} NOT NULL PRIMARY KEY,
			org_id          {key} NOT NULL,
			idempotency_key {key} NOT NULL,
			dossier_id      BIGINT NOT NULL,
			channel         VARCHAR(16) NOT NULL,
			to_recipient    VARCHAR(64) NOT NULL,
			template_code   {key} NOT NULL,
			subject         {subject} NOT NULL DEFAULT '',
			created_at      BIGINT NOT NULL,
			UNIQUE (org_id, idempotency_key))`,
		`CREATE TABLE IF NOT EXISTS msgsvc_consents (
			{autoid},
			org_id     {key} NOT NULL,
			dossier_id BIGINT NOT NULL,
			channel    VARCHAR(16) NOT NULL,
			status     VARCHAR(16) NOT NULL,
			updated_at BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS msgsvc_audit_events (
			{autoid},
			org_id      {key} NOT NULL,
			entity_type VARCHAR(32) NOT NULL,
			entity_id   {key} NOT NULL,
			action      VARCHAR(32) NOT NULL,
			details     {text} NOT NULL,
			created_at  BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS msgsvc_activities (
			{autoid},
			org_id        {key} NOT NULL,
			dossier_id    BIGINT NOT NULL,
			message_id    {key} NOT NULL,
			activity_type VARCHAR(32) NOT NULL,
			metadata      {text} NOT NULL,
			created_at    BIGINT NOT NULL)`,
	}
	indexes := [][2]string{
		{"msgsvc_messages_dossier", "msgsvc_messages (org_id, dossier_id, created_at)"},
		{"msgsvc_consents_dossier", "msgsvc_consents (org_id, dossier_id, channel, id)"},
		{"msgsvc_audit_entity", "msgsvc_audit_events (org_id, entity_type, entity_id, id)"},
		{"msgsvc_activities_dossier", "msgsvc_activities (org_id, dossier_id, id)"},
		{"msgsvc_activities_message", "msgsvc_activities (org_id, message_id, id)"},
	}
	var out []string
	for _, t := range tables {
		out = append(out, r.Replace(t))
	}
	for _, ix := range indexes {
		// MariaDB, PostgreSQL and SQLite all know CREATE INDEX IF NOT EXISTS.
		out = append(out, "CREATE INDEX IF NOT EXISTS "+ix[0]+" ON "+ix[1])
	}
	return append(out, d.triggers()...)
}

// subjectType is the type of msgsvc_messages.subject (at most maxSubject
// characters).
func (d dialect) subjectType() string {
	if d.name == "mysql" {
		return "VARCHAR(255) CHARACTER SET utf8mb4"
	}
	return "VARCHAR(255)"
}

// The audit trail of the processor's and the webhook's state changes is
// written by triggers on the outbox table, so each audit row and activity
// commits in the same transaction as the change it describes, whichever
// component (processor, webhook, retry endpoint) made it:
//
//	-> SENT                  audit SENT,      activity MESSAGE_SENT
//	-> FAILED                audit FAILED,    activity MESSAGE_FAILED
//	-> DELIVERED             audit UPDATED,   activity MESSAGE_STATUS_UPDATE (delivered)
//	read_at set              audit UPDATED,   activity MESSAGE_STATUS_UPDATE (read)
//	FAILED -> PENDING        audit REQUEUED
//	-> CANCELLED             audit CANCELLED  (an operator's cancel, e.g. from the admin API)
//
// Only rows with a msgsvc_messages row (messages of this service) are
// audited. CREATED and BLOCKED_BY_POLICY are written by the API in its own
// transaction.
func (d dialect) triggers() []string {
	t := d.outboxTable
	switch d.name {
	case "postgres":
		return []string{
			`CREATE OR REPLACE FUNCTION msgsvc_audit_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	m  msgsvc_messages%ROWTYPE;
	ts bigint;
BEGIN
	SELECT * INTO m FROM msgsvc_messages WHERE id = NEW.id;
	IF NOT FOUND THEN
		RETURN NULL;
	END IF;
	ts := (extract(epoch FROM NEW.updated_at) * 1000000)::bigint;
	IF NEW.status = 'SENT' AND OLD.status <> 'SENT' THEN
		INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
		VALUES (m.org_id, 'OUTBOUND_MESSAGE', m.id, 'SENT', 'Message sent successfully', ts);
		INSERT INTO msgsvc_activities (org_id, dossier_id, message_id, activity_type, metadata, created_at)
		VALUES (m.org_id, m.dossier_id, m.id, 'MESSAGE_SENT',
			json_build_object('outboundMessageId', m.id, 'channel', m.channel, 'to', m.to_recipient, 'status', 'SENT')::text, ts);
	ELSIF NEW.status = 'FAILED' AND OLD.status <> 'FAILED' THEN
		INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
		VALUES (m.org_id, 'OUTBOUND_MESSAGE', m.id, 'FAILED',
			'Message failed: ' || coalesce(NEW.last_error_message, '') || ' (' || coalesce(NEW.last_error_code, '') || ')', ts);
		INSERT INTO msgsvc_activities (org_id, dossier_id, message_id, activity_type, metadata, created_at)
		VALUES (m.org_id, m.dossier_id, m.id, 'MESSAGE_FAILED',
			json_build_object('outboundMessageId', m.id, 'channel', m.channel, 'errorCode', NEW.last_error_code)::text, ts);
	ELSIF NEW.status = 'DELIVERED' AND OLD.status <> 'DELIVERED' THEN
		INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
		VALUES (m.org_id, 'OUTBOUND_MESSAGE', m.id, 'UPDATED', 'Delivery status updated to: delivered', ts);
		INSERT INTO msgsvc_activities (org_id, dossier_id, message_id, activity_type, metadata, created_at)
		VALUES (m.org_id, m.dossier_id, m.id, 'MESSAGE_STATUS_UPDATE',
			json_build_object('outboundMessageId', m.id, 'providerMessageId', NEW.provider_message_id, 'status', 'delivered', 'channel', m.channel)::text, ts);
	ELSIF NEW.status = 'PENDING' AND OLD.status = 'FAILED' THEN
		INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
		VALUES (m.org_id, 'OUTBOUND_MESSAGE', m.id, 'REQUEUED', 'Failed message requeued for retry', ts);
	ELSIF NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED' THEN
		INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
		VALUES (m.org_id, 'OUTBOUND_MESSAGE', m.id, 'CANCELLED', 'Message cancelled (was ' || OLD.status || ')', ts);
	END IF;
	IF NEW.read_at IS NOT NULL AND OLD.read_at IS NULL THEN
		INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
		VALUES (m.org_id, 'OUTBOUND_MESSAGE', m.id, 'UPDATED', 'Delivery status updated to: read', ts);
		INSERT INTO msgsvc_activities (org_id, dossier_id, message_id, activity_type, metadata, created_at)
		VALUES (m.org_id, m.dossier_id, m.id, 'MESSAGE_STATUS_UPDATE',
			json_build_object('outboundMessageId', m.id, 'providerMessageId', NEW.provider_message_id, 'status', 'read', 'channel', m.channel)::text, ts);
	END IF;
	RETURN NULL;
END $$`,
			`DROP TRIGGER IF EXISTS msgsvc_audit ON ` + t,
			`CREATE TRIGGER msgsvc_audit AFTER UPDATE ON ` + t + ` FOR EACH ROW
	WHEN (NEW.status IN ('SENT', 'DELIVERED', 'FAILED', 'CANCELLED') AND OLD.status IS DISTINCT FROM NEW.status
		OR OLD.status = 'FAILED' AND NEW.status = 'PENDING'
		OR OLD.read_at IS NULL AND NEW.read_at IS NOT NULL)
	EXECUTE FUNCTION msgsvc_audit_outbox()`,
		}
	case "mysql":
		ins := func(action, details string) string {
			return `INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
				SELECT m.org_id, 'OUTBOUND_MESSAGE', CONVERT(m.id USING utf8mb4), '` + action + `', ` + details + `, ts
				FROM msgsvc_messages m WHERE m.id = NEW.id;`
		}
		act := func(typ, obj string) string {
			return `INSERT INTO msgsvc_activities (org_id, dossier_id, message_id, activity_type, metadata, created_at)
				SELECT m.org_id, m.dossier_id, CONVERT(m.id USING utf8mb4), '` + typ + `', ` + obj + `, ts
				FROM msgsvc_messages m WHERE m.id = NEW.id;`
		}
		id := `'outboundMessageId', CONVERT(m.id USING utf8mb4)`
		pid := `'providerMessageId', CONVERT(NEW.provider_message_id USING utf8mb4)`
		return []string{
			`DROP TRIGGER IF EXISTS msgsvc_audit`,
			`CREATE TRIGGER msgsvc_audit AFTER UPDATE ON ` + t + ` FOR EACH ROW
BEGIN
	DECLARE ts BIGINT DEFAULT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', NEW.updated_at);
	IF NEW.status = 'SENT' AND OLD.status <> 'SENT' THEN
		` + ins("SENT", `'Message sent successfully'`) + `
		` + act("MESSAGE_SENT", `JSON_OBJECT(`+id+`, 'channel', m.channel, 'to', m.to_recipient, 'status', 'SENT')`) + `
	ELSEIF NEW.status = 'FAILED' AND OLD.status <> 'FAILED' THEN
		` + ins("FAILED", `CONCAT('Message failed: ', COALESCE(NEW.last_error_message, ''), ' (', COALESCE(NEW.last_error_code, ''), ')')`) + `
		` + act("MESSAGE_FAILED", `JSON_OBJECT(`+id+`, 'channel', m.channel, 'errorCode', NEW.last_error_code)`) + `
	ELSEIF NEW.status = 'DELIVERED' AND OLD.status <> 'DELIVERED' THEN
		` + ins("UPDATED", `'Delivery status updated to: delivered'`) + `
		` + act("MESSAGE_STATUS_UPDATE", `JSON_OBJECT(`+id+`, `+pid+`, 'status', 'delivered', 'channel', m.channel)`) + `
	ELSEIF NEW.status = 'PENDING' AND OLD.status = 'FAILED' THEN
		` + ins("REQUEUED", `'Failed message requeued for retry'`) + `
	ELSEIF NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED' THEN
		` + ins("CANCELLED", `CONCAT('Message cancelled (was ', OLD.status, ')')`) + `
	END IF;
	IF NEW.read_at IS NOT NULL AND OLD.read_at IS NULL THEN
		` + ins("UPDATED", `'Delivery status updated to: read'`) + `
		` + act("MESSAGE_STATUS_UPDATE", `JSON_OBJECT(`+id+`, `+pid+`, 'status', 'read', 'channel', m.channel)`) + `
	END IF;
END`,
		}
	default: // sqlite
		trig := func(name, when, body string) string {
			return `CREATE TRIGGER IF NOT EXISTS msgsvc_audit_` + name + ` AFTER UPDATE ON ` + t +
				` FOR EACH ROW WHEN ` + when + ` BEGIN ` + body + ` END`
		}
		ins := func(action, details string) string {
			return `INSERT INTO msgsvc_audit_events (org_id, entity_type, entity_id, action, details, created_at)
				SELECT m.org_id, 'OUTBOUND_MESSAGE', m.id, '` + action + `', ` + details + `, NEW.updated_at
				FROM msgsvc_messages m WHERE m.id = NEW.id;`
		}
		act := func(typ, obj string) string {
			return `INSERT INTO msgsvc_activities (org_id, dossier_id, message_id, activity_type, metadata, created_at)
				SELECT m.org_id, m.dossier_id, m.id, '` + typ + `', ` + obj + `, NEW.updated_at
				FROM msgsvc_messages m WHERE m.id = NEW.id;`
		}
		return []string{
			trig("sent", `NEW.status = 'SENT' AND OLD.status <> 'SENT'`,
				ins("SENT", `'Message sent successfully'`)+
					act("MESSAGE_SENT", `json_object('outboundMessageId', m.id, 'channel', m.channel, 'to', m.to_recipient, 'status', 'SENT')`)),
			trig("failed", `NEW.status = 'FAILED' AND OLD.status <> 'FAILED'`,
				ins("FAILED", `'Message failed: ' || coalesce(NEW.last_error_message, '') || ' (' || coalesce(NEW.last_error_code, '') || ')'`)+
					act("MESSAGE_FAILED", `json_object('outboundMessageId', m.id, 'channel', m.channel, 'errorCode', NEW.last_error_code)`)),
			trig("delivered", `NEW.status = 'DELIVERED' AND OLD.status <> 'DELIVERED'`,
				ins("UPDATED", `'Delivery status updated to: delivered'`)+
					act("MESSAGE_STATUS_UPDATE", `json_object('outboundMessageId', m.id, 'providerMessageId', NEW.provider_message_id, 'status', 'delivered', 'channel', m.channel)`)),
			trig("requeued", `NEW.status = 'PENDING' AND OLD.status = 'FAILED'`,
				ins("REQUEUED", `'Failed message requeued for retry'`)),
			trig("cancelled", `NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED'`,
				ins("CANCELLED", `'Message cancelled (was ' || OLD.status || ')'`)),
			trig("read", `NEW.read_at IS NOT NULL AND OLD.read_at IS NULL`,
				ins("UPDATED", `'Delivery status updated to: read'`)+
					act("MESSAGE_STATUS_UPDATE", `json_object('outboundMessageId', m.id, 'providerMessageId', NEW.provider_message_id, 'status', 'read', 'channel', m.channel)`)),
		}
	}
}

// migrate creates the service's tables and triggers (after the outbox
// store's own migrations, since the triggers attach to its table).
func (d dialect) migrate(ctx context.Context, db *sql.DB) error {
	for _, stmt := range d.schema() {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate: %w (statement: %.80s)", err, stmt)
		}
	}
	// Columns added since the first version of the tables.
	return d.addColumn(ctx, db, "msgsvc_messages", "subject", d.subjectType()+" NOT NULL DEFAULT ''")
}

// addColumn adds a column to a table made before it existed. Two
// processes may race here: the loser's ALTER fails, and it looks again.
func (d dialect) addColumn(ctx context.Context, db *sql.DB, table, column, def string) error {
	has := func() (bool, error) {
		var q string
		switch d.name {
		case "postgres":
			q = "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2"
		case "mysql":
			q = "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?"
		default:
			q = "SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?"
		}
		var n int
		err := db.QueryRowContext(ctx, q, table, column).Scan(&n)
		return n > 0, err
	}
	ok, err := has()
	if err != nil || ok {
		return err
	}
	if _, err := db.ExecContext(ctx, "ALTER TABLE "+table+" ADD COLUMN "+column+" "+def); err != nil {
		if ok, err2 := has(); err2 == nil && ok {
			return nil
		}
		return fmt.Errorf("migrate: add %s.%s: %w", table, column, err)
	}
	return nil
}
