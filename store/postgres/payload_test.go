package postgres_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestContentTypeMigration migrates a table holding rows written before
// content types (schema version 5) and reads them back unchanged; JSON
// payloads stay queryable as json; migrating down is refused while a
// binary payload exists and works once it is gone.
func TestContentTypeMigration(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 4)
	ctx := context.Background()
	schema := pg.Name + "_ct"
	t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	s, err := postgres.New(pg.Pool, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MigrateTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	const oldPayload = `{"b": 1,   "a": ["x"]}`
	oldID := outbox.NewID(time.Now())
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_messages (id, tenant, topic, grp, idempotency_key,
		status, attempts, max_attempts, next_attempt_at, created_at, updated_at, payload)
		VALUES ($1, '', 'orders', '', $1, 'PENDING', 0, 0, now(), now(), now(), $2::json)`, oldID, oldPayload); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over old rows: %v", err)
	}
	m, err := s.MessageGet(ctx, outbox.MessageGetParams{ID: oldID})
	if err != nil || string(m.Payload) != oldPayload || m.ContentType != "" || !m.IsJSON() {
		t.Fatalf("old row after Migrate: payload %q content type %q, %v", m.Payload, m.ContentType, err)
	}

	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	bin := []byte{0x0a, 0x00, 0xff}
	res, err := ob.Enqueue(ctx, outbox.Message{Topic: "orders", ContentType: "application/x-protobuf", Payload: bin},
		outbox.Message{Topic: "orders", ContentType: "application/cloudevents+json", Payload: []byte(`{"a":["y"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	// JSON payloads, old and new, are json to SQL; binary ones are bytea.
	var jsonA []string
	rows, err := pg.Pool.Query(ctx, `SELECT payload->'a'->>0 FROM `+schema+`.outbox_messages WHERE payload IS NOT NULL ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	if jsonA, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || strings.Join(jsonA, ",") != "x,y" {
		t.Fatalf("payload->'a'->>0 over the JSON rows: %v, %v", jsonA, err)
	}
	var raw []byte
	if err := pg.Pool.QueryRow(ctx, `SELECT payload_bytes FROM `+schema+`.outbox_messages WHERE id = $1`, res[0].Message.ID).Scan(&raw); err != nil || !bytes.Equal(raw, bin) {
		t.Fatalf("payload_bytes: %x, %v", raw, err)
	}

	if err := s.MigrateTo(ctx, 5); err == nil || !strings.Contains(err.Error(), "non-JSON payloads") {
		t.Fatalf("MigrateTo(5) with a binary payload stored: %v; want a refusal naming non-JSON payloads", err)
	}
	// The down migrations run in one transaction: the refusal leaves the
	// newest version.
	migs := s.Migrations()
	if v, _ := s.SchemaVersion(ctx); v != migs[len(migs)-1].Version {
		t.Fatalf("a refused migration left version %d", v)
	}
	if _, err := pg.Pool.Exec(ctx, `DELETE FROM `+schema+`.outbox_messages WHERE id = $1`, res[0].Message.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.MigrateTo(ctx, 5); err != nil {
		t.Fatalf("MigrateTo(5) with JSON payloads only: %v", err)
	}
	var p string
	if err := pg.Pool.QueryRow(ctx, `SELECT payload::text FROM `+schema+`.outbox_messages WHERE id = $1`, oldID).Scan(&p); err != nil || p != oldPayload {
		t.Fatalf("old row after down: %q, %v", p, err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
}
