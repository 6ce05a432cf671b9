// Command flowcatalyst-processor is seed 004's FlowCatalyst outbox processor
// built from outboxkit: it polls the outbox_events and outbox_dispatch_jobs
// tables that applications (in any language) write in their own
// transactions, and sends the rows to FlowCatalyst's batch API, in order
// within each message group, retrying failures up to max-retries and
// recovering rows left PROCESSING by a crashed processor.
//
//	go run ./examples/flowcatalyst-processor \
//	    -database-url postgres://postgres@127.0.0.1:5432/app \
//	    -api-base-url https://flowcatalyst.example.com -api-token "$TOKEN"
//
// On MySQL 8 or MariaDB 10.6+, add -database-type MYSQL and give
// -database-url as mysql://user:pass@host:3306/app (or a Go MySQL DSN). On
// MongoDB, add -database-type MONGODB, -database-url mongodb://... and
// -mongo-database (the database holding the collections).
//
// Every setting is a flag and an environment variable named after seed
// 004's keys: -poll-interval or OUTBOX_PROCESSOR_POLL_INTERVAL
// (outbox-processor.poll-interval), and so on; flags win. Run with -h for
// the list. Logs are JSON lines on stderr. SIGTERM or SIGINT stops it
// cleanly: it stops claiming, lets in-flight requests finish (drain-timeout)
// and puts the rows it claimed but did not send back to PENDING.
//
// Exit status: 0 after a clean stop, 2 for an invalid configuration, 1 for
// any other failure.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"go.mongodb.org/mongo-driver/v2/mongo"
	mongooptions "go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	seedmongo "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	seedmysql "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mysql"
	seedpostgres "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
	"github.com/outboxkit/outboxkit/outbox"
	mongostore "github.com/outboxkit/outboxkit/store/mongo"
	mysqlstore "github.com/outboxkit/outboxkit/store/mysql"
	pgstore "github.com/outboxkit/outboxkit/store/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stderr))
}

// run is the program; it returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := loadConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "flowcatalyst-processor:", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("flowcatalyst-processor failed", "err", err)
		return 1
	}
	return 0
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(cfg.LogFormat, "text") {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// seedStore is what the program needs of a store over the seed's tables
// (flowcatalyst/seedstore/postgres, mysql or mongo).
type seedStore interface {
	outbox.Store
	Topics() []string
	CreateTables(ctx context.Context) error
}

func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	if !cfg.Enabled {
		log.Info("outbox processor disabled (enabled=false); idling until stopped")
		<-ctx.Done()
		return nil
	}
	var store seedStore
	var el elector
	opts := seedpostgres.Options{
		EventsTable: cfg.EventsTable, DispatchJobsTable: cfg.DispatchJobsTable, Logger: log,
		UnorderedNullGroup: cfg.NullGroupUnordered, RecoveryCountsAttempt: cfg.RecoveryCountsAttempt,
	}
	lockName := "flowcatalyst-processor:" + cfg.EventsTable + ":" + cfg.DispatchJobsTable
	if cfg.mongo {
		client, err := mongo.Connect(mongooptions.Client().SetServerSelectionTimeout(10 * time.Second).ApplyURI(cfg.DatabaseURL))
		if err != nil {
			return fmt.Errorf("database-url: %w", err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = client.Disconnect(ctx)
		}()
		pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = client.Ping(pingCtx, nil)
		cancel()
		if err != nil {
			return fmt.Errorf("connecting to the database: %w", err)
		}
		db := client.Database(cfg.MongoDatabase)
		if store, err = seedmongo.New(db, seedmongo.Options{
			EventsTable: opts.EventsTable, DispatchJobsTable: opts.DispatchJobsTable, Logger: opts.Logger,
			UnorderedNullGroup: opts.UnorderedNullGroup, RecoveryCountsAttempt: opts.RecoveryCountsAttempt,
		}); err != nil {
			return err
		}
		if cfg.SingleActive {
			// The lease document goes into the seed store's locks
			// collection: store/mongo names its locks collection
			// <prefix>locks.
			ls, err := mongostore.New(db, mongostore.Options{
				TablePrefix: strings.TrimSuffix(seedmongo.DefaultLocksCollection, "locks"), Logger: log,
			})
			if err != nil {
				return err
			}
			el = ls.Elector(mongostore.ElectorOptions{Name: lockName})
		}
	} else {
		driver, dsn := "pgx", cfg.DatabaseURL
		if cfg.mysql {
			driver, dsn = "mysql", cfg.mysqlDSN
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			return fmt.Errorf("database-url: %w", err)
		}
		defer db.Close()
		db.SetMaxOpenConns(max(4, cfg.MaxConcurrentGroups/2))
		pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = db.PingContext(pingCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("connecting to the database: %w", err)
		}
		if cfg.mysql {
			store, err = seedmysql.New(db, seedmysql.Options(opts))
		} else {
			store, err = seedpostgres.New(db, opts)
		}
		if err != nil {
			return err
		}
		if cfg.SingleActive {
			var closeElector func()
			if el, closeElector, err = newSQLElector(ctx, cfg, db, lockName, log); err != nil {
				return err
			}
			defer closeElector()
		}
	}
	if cfg.CreateTables {
		if err := store.CreateTables(ctx); err != nil {
			return err
		}
	}

	var tokens flowcatalyst.TokenSource
	switch {
	case cfg.APIToken != "":
		tokens = flowcatalyst.StaticToken(cfg.APIToken)
	case cfg.APITokenURL != "":
		cc, err := flowcatalyst.NewClientCredentials(flowcatalyst.ClientCredentialsConfig{
			TokenURL: cfg.APITokenURL, ClientID: cfg.APIClientID, ClientSecret: cfg.APIClientSecret,
			Scopes: strings.Fields(cfg.APIScopes),
		})
		if err != nil {
			return err
		}
		tokens = cc
	}
	pub, err := flowcatalyst.New(flowcatalyst.Config{
		BaseURL: cfg.APIBaseURL, API: cfg.api, BatchSize: cfg.APIBatchSize, Token: tokens, Logger: log,
		ChargeEveryItem: strings.EqualFold(cfg.FailedRequestCharges, "all"),
	})
	if err != nil {
		return err
	}

	pcfg := outbox.Config{
		Topics:              store.Topics(),
		PollInterval:        cfg.PollInterval,
		PollBatchSize:       cfg.PollBatchSize,
		PublishBatchSize:    cfg.APIBatchSize,
		MaxConcurrentGroups: cfg.MaxConcurrentGroups,
		BufferSize:          cfg.GlobalBufferSize,
		ProcessingTimeout:   time.Duration(cfg.ProcessingTimeoutSeconds) * time.Second,
		RecoveryInterval:    cfg.RecoveryInterval,
		DrainTimeout:        cfg.DrainTimeout,
		MaxAttempts:         cfg.MaxRetries + 1,
		Backoff:             outbox.Backoff{Schedule: cfg.backoff},
		Logger:              log,
		Observer:            logObserver{log: log},
	}
	if el != nil {
		// The election outlives ctx until the processor has drained: no
		// other replica takes over while this one finishes its batches.
		stopElector := campaign(context.WithoutCancel(ctx), el, log)
		defer stopElector()
		pcfg.Leader = el
	}
	p, err := outbox.NewProcessor(store, pub, pcfg)
	if err != nil {
		return err
	}
	log.Info("flowcatalyst outbox processor starting",
		"api_base_url", cfg.APIBaseURL, "api_version", cfg.APIVersion,
		"events_table", cfg.EventsTable, "dispatch_jobs_table", cfg.DispatchJobsTable,
		"max_retries", cfg.MaxRetries, "processing_timeout_seconds", cfg.ProcessingTimeoutSeconds,
		"auth", authKind(cfg), "single_active", cfg.SingleActive)
	if err := p.Run(ctx); err != nil {
		return err
	}
	log.Info("flowcatalyst outbox processor stopped cleanly")
	return nil
}

func authKind(cfg config) string {
	switch {
	case cfg.APIToken != "":
		return "static-token"
	case cfg.APITokenURL != "":
		return "oauth2-client-credentials"
	}
	return "none"
}

// elector is a library store's leader election (the Elector of
// store/postgres, store/mysql or store/mongo): the replica that leads
// works, the others idle and try again every few seconds.
type elector interface {
	outbox.Leader
	Run(ctx context.Context, lead func(ctx context.Context)) error
}

// newSQLElector returns the elector of a PostgreSQL (advisory lock) or
// MySQL (GET_LOCK) database, from the library store of that database: the
// lock lives as long as a dedicated connection, and goes with it when the
// process dies. The library store itself is used for its elector only.
// Call closeFn once the elector's Run has returned.
func newSQLElector(ctx context.Context, cfg config, db *sql.DB, name string, log *slog.Logger) (el elector, closeFn func(), err error) {
	if cfg.mysql {
		ls, err := mysqlstore.New(db, mysqlstore.Options{Logger: log})
		if err != nil {
			return nil, nil, err
		}
		return ls.Elector(mysqlstore.ElectorOptions{Name: name}), func() {}, nil
	}
	// The advisory lock needs a pgx connection of its own; the pool opens
	// one when the elector asks for it.
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("database-url: %w", err)
	}
	ls, err := pgstore.New(pool, pgstore.Options{Logger: log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return ls.Elector(pgstore.ElectorOptions{Name: name}), pool.Close, nil
}

// campaign runs el until the returned stop is called, logging each time
// this processor becomes, or stops being, the active one.
func campaign(ctx context.Context, el elector, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = el.Run(ctx, func(term context.Context) {
			log.Info("single-active: this processor is now the active one")
			<-term.Done()
			if ctx.Err() == nil {
				log.Warn("single-active: no longer the active processor")
			}
		})
	}()
	return func() { cancel(); <-done }
}

// logObserver logs, at the default level, what an operator must see: a row
// that will be retried (warning) and a row that became FAILED (error). The
// publisher logs each failed request.
type logObserver struct {
	outbox.NopObserver
	log *slog.Logger
}

func (o logObserver) OnAttemptFinished(ctx context.Context, e outbox.AttemptEvent) {
	if e.Outcome != outbox.AttemptRetry {
		return
	}
	o.log.WarnContext(ctx, "row will be retried", "table_type", e.Message.Topic, "id", e.Message.ID,
		"message_group", e.Message.Group, "attempt", e.Attempt, "next_attempt_at", e.NextAttemptAt, "err", e.Err)
}

func (o logObserver) OnFailed(ctx context.Context, e outbox.AttemptEvent) {
	o.log.ErrorContext(ctx, "row FAILED", "table_type", e.Message.Topic, "id", e.Message.ID,
		"message_group", e.Message.Group, "attempt", e.Attempt, "err", e.Err)
}
