package mysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
)

// TestContentTypeMigration migrates a table holding rows written before
// content types (schema version 4) and reads them back unchanged; migrating
// down is refused while a non-JSON payload exists and works once it is gone.
func TestContentTypeMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := testbackend.MySQL(t, 4)
	st, err := mysql.New(d.DB, mysql.Options{TablePrefix: "ct_"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	const oldPayload = `{"b": 1,   "a": ["x"]}`
	oldID := outbox.NewID(time.Now())
	if _, err := d.DB.ExecContext(ctx, `INSERT INTO ct_messages (id, tenant, topic, grp, idempotency_key, payload,
		status, attempts, max_attempts, next_attempt_at, created_at, updated_at)
		VALUES (?, '', 'orders', '', ?, ?, 'PENDING', 0, 0, '2026-01-01', '2026-01-01', '2026-01-01')`, oldID, oldID, []byte(oldPayload)); err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over old rows: %v", err)
	}
	m, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: oldID})
	if err != nil || string(m.Payload) != oldPayload || m.ContentType != "" || !m.IsJSON() {
		t.Fatalf("old row after Migrate: payload %q content type %q, %v", m.Payload, m.ContentType, err)
	}

	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	bin := []byte{0x0a, 0x00, 0xff}
	res, err := ob.Enqueue(ctx, outbox.Message{Topic: "orders", ContentType: "application/x-protobuf", Payload: bin},
		outbox.Message{Topic: "orders", ContentType: "application/cloudevents+json; charset=utf-8", Payload: []byte(`{"n":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateTo(ctx, 4); err == nil || !strings.Contains(err.Error(), "non_json_payloads") {
		t.Fatalf("MigrateTo(4) with a binary payload stored: %v; want a refusal naming non-JSON payloads", err)
	}
	// MySQL runs the down migrations one by one: those above the
	// content-type one are undone, the content-type one is refused.
	ctVersion := 0
	for _, m := range st.Migrations() {
		if strings.Contains(m.Name, "content_type") {
			ctVersion = m.Version
		}
	}
	if v, _ := st.SchemaVersion(ctx); v != ctVersion || v == 0 {
		t.Fatalf("a refused migration left version %d, want %d (the content-type migration)", v, ctVersion)
	}
	// Read with SQL: the store's own queries want its newest schema (the
	// claim token), and the schema is now at the content-type version.
	var kept []byte
	if err := d.DB.QueryRowContext(ctx, `SELECT payload FROM ct_messages WHERE id = ?`, res[0].Message.ID).Scan(&kept); err != nil || !bytes.Equal(kept, bin) {
		t.Fatalf("the binary message after a refused down migration: %q, %v", kept, err)
	}
	if _, err := d.DB.ExecContext(ctx, `DELETE FROM ct_messages WHERE id = ?`, res[0].Message.ID); err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateTo(ctx, 4); err != nil {
		t.Fatalf("MigrateTo(4) with JSON payloads only: %v", err)
	}
	var p []byte
	if err := d.DB.QueryRowContext(ctx, `SELECT payload FROM ct_messages WHERE id = ?`, oldID).Scan(&p); err != nil || string(p) != oldPayload {
		t.Fatalf("old row after down: %q, %v", p, err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateDown(ctx); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
}
