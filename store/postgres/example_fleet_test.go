package postgres_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// One processor fleet over three tenants' outboxes. Each instance of the
// service runs the same Fleet; the instances share the tenants out through
// the lease tables of one coordination database. Here the tenants are
// schemas of one database, to keep the example small; a tenant per
// database only changes Open (one pool per database).
func ExampleShardLeaser() {
	ctx := context.Background()
	dsn := cmp.Or(os.Getenv("OUTBOXKIT_POSTGRES_DSN"), testbackend.PostgresDefaultDSN)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	prefix := fmt.Sprintf("example_fleet_%d_", time.Now().UnixNano())
	tenants := []string{prefix + "acme", prefix + "globex", prefix + "initech"}
	defer func() {
		for _, t := range append(tenants, prefix+"coord") {
			_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+t+" CASCADE")
		}
	}()
	for i, t := range tenants { // the application enqueues in each tenant's outbox
		s, err := postgres.New(pool, postgres.Options{Schema: t})
		if err != nil {
			log.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			log.Fatal(err)
		}
		msg := outbox.Message{Topic: "invoices", Group: "customer-1", Payload: json.RawMessage(fmt.Sprintf(`{"invoice":%d}`, i+1))}
		if _, err := outbox.New[pgx.Tx](s, outbox.Options{}).Enqueue(ctx, msg); err != nil {
			log.Fatal(err)
		}
	}

	leaser, err := postgres.NewShardLeaser(pool, postgres.ShardLeaserOptions{Schema: prefix + "coord"})
	if err != nil {
		log.Fatal(err)
	}
	if err := leaser.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var published []string
	done := make(chan struct{})
	fleet, err := outbox.NewFleet(outbox.FleetConfig{
		Databases: outbox.StaticDatabases(tenants...), // or a function that reads the tenant registry
		Open: func(ctx context.Context, tenant string) (outbox.ShardStore, error) {
			s, err := postgres.New(pool, postgres.Options{Schema: tenant})
			return outbox.ShardStore{Store: s}, err
		},
		Leaser:   leaser,
		LeaseTTL: time.Second, // 15s by default
		Publisher: outbox.PublishEach(func(ctx context.Context, m outbox.Message) outbox.Result {
			shard, _ := outbox.ShardFromContext(ctx) // which tenant's outbox
			mu.Lock()
			defer mu.Unlock()
			published = append(published, fmt.Sprintf("%s: %s", strings.TrimPrefix(shard.Shard, prefix), m.Payload))
			if len(published) == len(tenants) {
				close(done)
			}
			return outbox.Result{}
		}),
		Processor: outbox.Config{Topics: []string{"invoices"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = fleet.Run(runCtx) }()
	<-done
	fmt.Println("serving", len(fleet.Status().Shards), "tenants")
	stop()
	<-stopped

	slices.Sort(published)
	for _, p := range published {
		fmt.Println(p)
	}
	// Output:
	// serving 3 tenants
	// acme: {"invoice":1}
	// globex: {"invoice":2}
	// initech: {"invoice":3}
}
