package outboxotel_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	outboxotel "github.com/outboxkit/outboxkit/outbox/otel"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestStorageGauges: with a store that reports its storage (PostgreSQL),
// a collection reports each of its tables' live and dead rows and the
// cleanup horizon's age, which a transaction left open holds back.
func TestStorageGauges(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	tel, err := outboxotel.New(outboxotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Close() })

	// Dead rows in the messages table, reported by their session at once.
	conn, err := pg.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO ` + st.MessagesTable() + ` (id, tenant, topic, grp, idempotency_key, status, next_attempt_at, created_at, updated_at, payload)
SELECT 'm' || i, '', 't', '', 'm' || i, 'PENDING', now(), now(), now(), '{}'::json FROM generate_series(1, 200) AS i`,
		`UPDATE ` + st.MessagesTable() + ` SET status = 'SENT', sent_at = now()`,
		`SELECT pg_stat_force_next_flush()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			conn.Release()
			t.Fatal(err)
		}
	}
	conn.Release()
	// A transaction left open while 3 others run.
	pg.HoldHorizon(t, 3)

	table := attribute.NewSet(outboxotel.AttrTable.String(st.MessagesTable()))
	var rm metricdata.ResourceMetrics
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		if sumInt(t, rm, outboxotel.MetricStoreDeadRows, table) >= 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if dead := sumInt(t, rm, outboxotel.MetricStoreDeadRows, table); dead < 200 {
		t.Errorf("%s for the messages table = %d, want at least 200", outboxotel.MetricStoreDeadRows, dead)
	}
	if live := sumInt(t, rm, outboxotel.MetricStoreLiveRows, table); live != 200 {
		t.Errorf("%s for the messages table = %d, want 200", outboxotel.MetricStoreLiveRows, live)
	}
	if age := sumInt(t, rm, outboxotel.MetricStoreHorizonAge, *attribute.EmptySet()); age < 3 {
		t.Errorf("%s = %d with a transaction open for 3 others, want 3 or more", outboxotel.MetricStoreHorizonAge, age)
	}
	// The queue gauges still come with them.
	if n := sumInt(t, rm, outboxotel.MetricQueueDepth, attribute.NewSet(outboxotel.AttrStatus.String("SENT"))); n != 200 {
		t.Errorf("queue depth SENT = %d, want 200", n)
	}
}
