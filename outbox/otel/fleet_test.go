package outboxotel_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	outboxotel "github.com/outboxkit/outboxkit/outbox/otel"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestFleetGauges: a fleet instance serving two databases (schemas here)
// reports them, its membership, and each database's health and sent
// messages.
func TestFleetGauges(t *testing.T) {
	t.Parallel()
	pg := testbackend.Postgres(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaser, err := postgres.NewShardLeaser(pg.Pool, postgres.ShardLeaserOptions{Schema: pg.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaser.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	dbs := []string{pg.Name + "_a", pg.Name + "_b"}
	for i, db := range dbs {
		t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+db+" CASCADE") })
		s, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		for range i + 1 { // 1 message in _a, 2 in _b
			if _, err := outbox.New[pgx.Tx](s, outbox.Options{}).Enqueue(ctx, outbox.Message{Topic: "t", Payload: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	f, err := outbox.NewFleet(outbox.FleetConfig{
		ID: "one", Databases: outbox.StaticDatabases(dbs...), Leaser: leaser, LeaseTTL: time.Second,
		Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
			s, err := postgres.New(pg.Pool, postgres.Options{Schema: db})
			return outbox.ShardStore{Store: s}, err
		},
		Publisher: outbox.PublishEach(func(context.Context, outbox.Message) outbox.Result { return outbox.Result{} }),
		Processor: outbox.Config{AllTopics: true, PollInterval: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	stop, err := outboxotel.ObserveFleet(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), f)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stop() }()
	fctx, fcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() { fcancel(); <-done }()

	dbSet := func(db string) attribute.Set { return attribute.NewSet(outboxotel.AttrDatabase.String(db)) }
	var rm metricdata.ResourceMetrics
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		if _, ok := find(rm, outboxotel.MetricFleetShardSent); ok &&
			sumInt(t, rm, outboxotel.MetricFleetShardSent, dbSet(dbs[0])) == 1 && sumInt(t, rm, outboxotel.MetricFleetShardSent, dbSet(dbs[1])) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet's gauges never showed the 3 messages sent: %+v", f.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := sumInt(t, rm, outboxotel.MetricFleetDatabases, *attribute.EmptySet()); n != 2 {
		t.Errorf("%s = %d, want 2", outboxotel.MetricFleetDatabases, n)
	}
	if n := sumInt(t, rm, outboxotel.MetricFleetMembers, *attribute.EmptySet()); n != 1 {
		t.Errorf("%s = %d, want 1", outboxotel.MetricFleetMembers, n)
	}
	for _, db := range dbs {
		if n := sumInt(t, rm, outboxotel.MetricFleetShardHealthy, dbSet(db)); n != 1 {
			t.Errorf("%s for %s = %d, want 1", outboxotel.MetricFleetShardHealthy, db, n)
		}
	}
}
