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
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"go.mongodb.org/mongo-driver/v2/mongo"
	mongooptions "go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	seedmongo "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	seedmysql "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mysql"
	seedpostgres "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
	"github.com/outboxkit/outboxkit/outbox"
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
	var leader leaderService
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
			leader = newMongoLeader(db.Collection(seedmongo.DefaultLocksCollection), lockName, log)
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
			leader = newAdvisoryLeader(db, lockName, cfg.mysql, log)
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
	if leader != nil {
		stopLeader := leader.start(ctx)
		defer stopLeader()
		pcfg.Leader = leader
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

// leaderService is an outbox.Leader that runs until stopped.
type leaderService interface {
	outbox.Leader
	start(ctx context.Context) (stop func())
}

// advisoryLeader is an outbox.Leader holding a session lock on a dedicated
// connection (PostgreSQL: an advisory lock; MySQL: GET_LOCK): the processor
// that holds it works, the others idle and retry every few seconds. The
// lock is released when the connection closes (including when the process
// dies).
type advisoryLeader struct {
	db     *sql.DB
	lock   string // the statement taking the lock without waiting
	key    any
	log    *slog.Logger
	leader atomic.Bool
}

func newAdvisoryLeader(db *sql.DB, name string, mysql bool, log *slog.Logger) *advisoryLeader {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	if mysql {
		// GET_LOCK names have at most 64 characters.
		return &advisoryLeader{db: db, lock: `SELECT GET_LOCK(?, 0) = 1`, key: fmt.Sprintf("flowcatalyst-processor:%016x", h.Sum64()), log: log}
	}
	return &advisoryLeader{db: db, lock: `SELECT pg_try_advisory_lock($1)`, key: int64(h.Sum64()), log: log}
}

// IsLeader reports whether this processor holds the lock.
func (l *advisoryLeader) IsLeader() bool { return l.leader.Load() }

func (l *advisoryLeader) start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conn *sql.Conn
		defer func() {
			l.leader.Store(false)
			if conn != nil {
				_ = conn.Close()
			}
		}()
		t := time.NewTicker(3 * time.Second)
		defer t.Stop()
		for {
			switch {
			case conn == nil:
				c, err := l.db.Conn(ctx)
				if err == nil {
					conn = c
				}
				if conn == nil {
					break
				}
				fallthrough
			case !l.leader.Load():
				var got sql.NullBool
				if err := conn.QueryRowContext(ctx, l.lock, l.key).Scan(&got); err != nil {
					_ = conn.Close()
					conn = nil
					break
				}
				if got.Bool {
					l.leader.Store(true)
					l.log.Info("single-active: this processor is now the active one")
				}
			default:
				if err := conn.PingContext(ctx); err != nil {
					l.leader.Store(false)
					l.log.Warn("single-active: lost the database session holding the lock", "err", err)
					_ = conn.Close()
					conn = nil
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
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
