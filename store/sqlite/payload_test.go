package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// TestContentTypeMigration migrates a table holding rows written before
// content types (schema version 4) and reads them back unchanged; migrating
// down is refused while a binary payload exists and works once it is gone.
func TestContentTypeMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "ct.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.MigrateTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	const oldPayload = `{"b": 1,   "a": ["x"]}`
	oldID := outbox.NewID(time.Now())
	if _, err := st.DB().ExecContext(ctx, `INSERT INTO outbox_messages (id, tenant, topic, grp, idempotency_key, payload,
		status, attempts, max_attempts, next_attempt_at, created_at, updated_at)
		VALUES (?, '', 'orders', '', ?, ?, 'PENDING', 0, 0, 0, 0, 0)`, oldID, oldID, oldPayload); err != nil {
		t.Fatal(err)
	}

	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over old rows: %v", err)
	}
	m, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: oldID})
	if err != nil || string(m.Payload) != oldPayload || m.ContentType != "" || !m.IsJSON() {
		t.Fatalf("old row after Migrate: payload %q content type %q, %v", m.Payload, m.ContentType, err)
	}
	// Operators' SQL still reads JSON payloads as JSON.
	var a string
	if err := st.DB().QueryRowContext(ctx, `SELECT json_extract(payload, '$.a[0]') FROM outbox_messages WHERE id = ?`, oldID).Scan(&a); err != nil || a != "x" {
		t.Fatalf("json_extract on an old row: %q, %v", a, err)
	}

	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	bin := []byte{0x0a, 0x00, 0xff}
	res, err := ob.Enqueue(ctx, outbox.Message{Topic: "orders", ContentType: "application/x-protobuf", Payload: bin},
		outbox.Message{Topic: "orders", ContentType: "application/cloudevents+json", Payload: []byte(`{"n":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateTo(ctx, 4); err == nil || !strings.Contains(err.Error(), "non-JSON payloads") {
		t.Fatalf("MigrateTo(4) with a binary payload stored: %v; want a refusal naming non-JSON payloads", err)
	}
	if v, _ := st.SchemaVersion(ctx); v != len(st.Migrations()) {
		t.Fatalf("a refused migration left version %d", v)
	}
	if got, err := st.MessageGet(ctx, outbox.MessageGetParams{ID: res[0].Message.ID}); err != nil || !bytes.Equal(got.Payload, bin) {
		t.Fatalf("the binary message after a refused down migration: %q, %v", got.Payload, err)
	}
	if _, err := st.DB().ExecContext(ctx, `DELETE FROM outbox_messages WHERE id = ?`, res[0].Message.ID); err != nil {
		t.Fatal(err)
	}
	if err := st.MigrateTo(ctx, 4); err != nil {
		t.Fatalf("MigrateTo(4) with JSON payloads only: %v", err)
	}
	var p string
	if err := st.DB().QueryRowContext(ctx, `SELECT payload FROM outbox_messages WHERE id = ?`, oldID).Scan(&p); err != nil || p != oldPayload {
		t.Fatalf("old row after down: %q, %v", p, err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
}
