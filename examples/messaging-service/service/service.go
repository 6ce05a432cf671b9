// Package service is the outbound messaging service of the seed documents
// (a REST API for WhatsApp messages per organisation, consent, an audit
// trail and activity timeline, delivery receipts by webhook) built on
// outboxkit: the API enqueues in its own database transaction through
// outbox.Outbox, outbox.Run publishes through whatsapp.Publisher, and
// whatsapp.Webhook applies Meta's signed receipts to the store.
package service

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxkit/outboxkit/outbox"
	outboxotel "github.com/outboxkit/outboxkit/outbox/otel"
	"github.com/outboxkit/outboxkit/store/mysql"
	"github.com/outboxkit/outboxkit/store/postgres"
	"github.com/outboxkit/outboxkit/store/sqlite"
	"github.com/outboxkit/outboxkit/whatsapp"
	"github.com/outboxkit/outboxkit/whatsapp/redisstate"
)

// Topic is the outbox topic of WhatsApp messages.
const Topic = "whatsapp"

// Org is one organisation (tenant): its API key and WhatsApp settings.
type Org struct {
	// ID is the organisation ID callers send in X-Org-Id.
	ID string `json:"id"`
	// APIKey authenticates the organisation's callers. Only its SHA-256 is
	// stored; give either APIKey or APIKeySHA256.
	APIKey string `json:"apiKey,omitempty"`
	// APIKeySHA256 is the hex SHA-256 of the API key, for configurations
	// that should not hold the key itself.
	APIKeySHA256 string `json:"apiKeySha256,omitempty"`
	// WhatsApp holds the organisation's Cloud API credentials.
	WhatsApp whatsapp.Credentials `json:"whatsapp"`
}

// Config configures a Service. Zero fields take the documented defaults.
type Config struct {
	// Store is "sqlite" (default), "postgres" or "mysql".
	Store string
	// DSN is the database: a file name for SQLite (defaults to
	// DefaultSQLitePath()), a PostgreSQL URL, or a MySQL DSN.
	DSN string
	// PostgresSchema holds the tables on PostgreSQL. Defaults to "public".
	PostgresSchema string
	// MaxConns caps the database connections. Defaults to 16.
	MaxConns int
	// Orgs are the organisations. Required (at least one).
	Orgs []Org
	// GraphBaseURL is the WhatsApp Cloud API root (the fake's URL, or
	// whatsapp.DefaultBaseURL). Required.
	GraphBaseURL string
	// GraphAPIVersion is the Graph API version. Defaults to the whatsapp
	// package's default.
	GraphAPIVersion string
	// RedisAddr, when set, keeps 24-hour windows, quotas and inbound
	// de-duplication in Redis; otherwise in the database.
	RedisAddr string
	// RedisPrefix starts the service's Redis keys. Defaults to
	// "msgsvc:whatsapp:".
	RedisPrefix string
	// QuotaPerDay is each organisation's WhatsApp quota per 24 hours.
	// Defaults to 1000.
	QuotaPerDay int64
	// MaxAttempts is a message's publish attempts. Defaults to 5 (seed).
	MaxAttempts int
	// Backoff is the retry schedule. Defaults to the seed's 1, 5, 15, 60 and
	// 360 minutes.
	Backoff []time.Duration
	// PollInterval is the processor's longest wait between claims (new
	// messages wake it at once). Defaults to 1 s.
	PollInterval time.Duration
	// BatchSize is the most messages the processor claims at once (the
	// seed's outbound.worker.batch-size). Defaults to outbox's default
	// (500).
	BatchSize int
	// ProcessingTimeout is the lease after which a message whose processor
	// died is recovered (the seed's stale SENDING recovery). Defaults to
	// 10 min.
	ProcessingTimeout time.Duration
	// RecoveryInterval is how often expired leases are recovered. Defaults
	// to 1 min.
	RecoveryInterval time.Duration
	// DrainTimeout is how long in-flight sends may finish at shutdown. It
	// must be shorter than ProcessingTimeout. Defaults to 10 s, or half of
	// ProcessingTimeout when that is shorter.
	DrainTimeout time.Duration
	// MaxBodyBytes limits API request bodies (413 beyond). Defaults to
	// 256 KiB.
	MaxBodyBytes int64
	// ErrorClasses overrides the class (retryable or permanent) of WhatsApp
	// error codes for this deployment (whatsapp.Config.ErrorClasses).
	ErrorClasses map[int]whatsapp.ErrorClass
	// DisableMetrics stops serving MetricsPath. By default the Prometheus
	// metrics (the outbox's, from outbox/otel, and the HTTP server's) are
	// served there.
	DisableMetrics bool
	// Logger receives structured logs. Defaults to discarding them.
	Logger *slog.Logger
	// AdminToken, when set, serves outboxkit's admin API and dashboard
	// (outbox/admin: every organisation's messages, dead letters, requeue,
	// pauses) under AdminPath to requests with "Authorization: Bearer
	// <AdminToken>". At least 16 characters. Empty: not served.
	AdminToken string
}

// AdminPath is where the admin API and dashboard are served when
// Config.AdminToken is set.
const AdminPath = "/admin/"

// MetricsPath is where the Prometheus metrics are served (unless
// Config.DisableMetrics).
const MetricsPath = "/metrics"

// DefaultSQLitePath is the SQLite file used when no DSN is given:
// messaging-service.db in the user's cache directory
// ($XDG_CACHE_HOME/outboxkit, ~/.cache/outboxkit on Linux), or in the
// temporary directory when there is none, so that a run from a source
// checkout leaves no database file in it.
func DefaultSQLitePath() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "outboxkit", "messaging-service.db")
}

var pgSchemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

func (c *Config) defaults() error {
	if c.Store == "" {
		c.Store = "sqlite"
	}
	switch c.Store {
	case "sqlite":
		if c.DSN == "" {
			c.DSN = DefaultSQLitePath()
			if err := os.MkdirAll(filepath.Dir(c.DSN), 0o700); err != nil {
				return fmt.Errorf("config: the default SQLite directory: %w", err)
			}
		}
	case "postgres", "mysql":
		if c.DSN == "" {
			return fmt.Errorf("config: store %s needs a DSN", c.Store)
		}
	default:
		return fmt.Errorf("config: unknown store %q (sqlite, postgres or mysql)", c.Store)
	}
	if c.PostgresSchema == "" {
		c.PostgresSchema = "public"
	}
	if !pgSchemaRE.MatchString(c.PostgresSchema) {
		return fmt.Errorf("config: PostgreSQL schema %q is not a lowercase identifier", c.PostgresSchema)
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 16
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		return errors.New("config: the admin token must be at least 16 characters")
	}
	if len(c.Orgs) == 0 {
		return errors.New("config: no organisations configured")
	}
	seen := map[string]bool{}
	for i, o := range c.Orgs {
		if o.ID == "" || len(o.ID) > 255 {
			return fmt.Errorf("config: organisation %d: id is empty or too long", i)
		}
		if seen[o.ID] {
			return fmt.Errorf("config: organisation %q appears twice", o.ID)
		}
		seen[o.ID] = true
		if (o.APIKey == "") == (o.APIKeySHA256 == "") {
			return fmt.Errorf("config: organisation %q: give exactly one of apiKey and apiKeySha256", o.ID)
		}
		if o.APIKey != "" && len(o.APIKey) < 16 {
			return fmt.Errorf("config: organisation %q: the API key must have at least 16 characters", o.ID)
		}
		if o.APIKeySHA256 != "" {
			if b, err := hex.DecodeString(o.APIKeySHA256); err != nil || len(b) != sha256.Size {
				return fmt.Errorf("config: organisation %q: apiKeySha256 is not a hex SHA-256", o.ID)
			}
		}
		if o.WhatsApp.PhoneNumberID == "" || o.WhatsApp.AccessToken == "" || o.WhatsApp.AppSecret == "" {
			return fmt.Errorf("config: organisation %q: whatsapp needs phoneNumberId, accessToken and appSecret", o.ID)
		}
	}
	if c.GraphBaseURL == "" {
		return errors.New("config: GraphBaseURL is required")
	}
	if c.QuotaPerDay <= 0 {
		c.QuotaPerDay = whatsapp.DefaultQuotaLimit
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.MaxAttempts > outbox.MaxAttemptsLimit {
		return fmt.Errorf("config: max attempts %d is above %d", c.MaxAttempts, outbox.MaxAttemptsLimit)
	}
	if c.BatchSize < 0 {
		return errors.New("config: the batch size must not be negative")
	}
	for _, d := range c.Backoff {
		if d <= 0 {
			return errors.New("config: every backoff step must be positive")
		}
	}
	if len(c.Backoff) == 0 {
		c.Backoff = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour, 6 * time.Hour}
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.ProcessingTimeout <= 0 {
		c.ProcessingTimeout = 10 * time.Minute
	}
	if c.RecoveryInterval <= 0 {
		c.RecoveryInterval = time.Minute
	}
	if c.DrainTimeout <= 0 {
		// Inside the lease (outbox.Config refuses a drain that outlives it).
		c.DrainTimeout = min(10*time.Second, c.ProcessingTimeout/2)
	}
	if c.DrainTimeout >= c.ProcessingTimeout {
		return fmt.Errorf("config: the drain timeout (%s) must be shorter than the stale (processing) timeout (%s)", c.DrainTimeout, c.ProcessingTimeout)
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 256 << 10
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Service is the messaging service: its HTTP handler and its processor.
type Service struct {
	cfg   Config
	log   *slog.Logger
	d     dialect
	db    *sql.DB
	pool  *pgxpool.Pool // PostgreSQL only
	store outbox.Store
	ob    *outbox.Outbox[*sql.Tx]
	inTx  func(ctx context.Context, fn func(tx *sql.Tx) error) error
	close []func() error

	publisher *whatsapp.Publisher
	webhook   *whatsapp.Webhook
	mux       *http.ServeMux
	handler   http.Handler // mux, measured
	tel       *outboxotel.Telemetry
	mp        *sdkmetric.MeterProvider
	metrics   http.Handler

	keys sync.Map // key hash -> cachedKey (only keys found in the table)

	mu        sync.Mutex
	processor *outbox.Processor
	ready     atomic.Bool
}

// New opens the database, runs the outbox store's migrations and the
// service's own, stores the organisations' hashed API keys, and wires the
// publisher and the webhook. It fails on any misconfiguration.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: cfg.Logger}
	ok := false
	defer func() {
		if !ok {
			_ = s.Close()
		}
	}()
	if err := s.openStore(ctx); err != nil {
		return nil, err
	}
	if err := s.d.migrate(ctx, s.db); err != nil {
		return nil, err
	}
	if err := s.storeAPIKeys(ctx); err != nil {
		return nil, err
	}
	creds := whatsapp.StaticCredentials{}
	for _, o := range cfg.Orgs {
		creds[o.ID] = o.WhatsApp
	}
	var state whatsapp.State
	qo := whatsapp.QuotaOptions{DefaultLimit: cfg.QuotaPerDay}
	if cfg.RedisAddr != "" {
		rc := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr})
		s.close = append(s.close, rc.Close)
		if err := rc.Ping(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis %s: %w", cfg.RedisAddr, err)
		}
		state = redisstate.New(rc, redisstate.Options{Prefix: cmpOr(cfg.RedisPrefix, "msgsvc:whatsapp:"), QuotaOptions: qo})
	} else {
		st, err := whatsapp.NewSQLState(s.db, whatsapp.SQLOptions{Dialect: whatsapp.Dialect(s.d.name), TablePrefix: "msgsvc_wa_", QuotaOptions: qo})
		if err != nil {
			return nil, err
		}
		if err := st.Migrate(ctx); err != nil {
			return nil, fmt.Errorf("whatsapp state: %w", err)
		}
		state = st
	}
	if err := s.setupMetrics(); err != nil {
		return nil, err
	}
	pub, err := whatsapp.NewPublisher(whatsapp.Config{
		Credentials:  creds,
		BaseURL:      cfg.GraphBaseURL,
		APIVersion:   cfg.GraphAPIVersion,
		Windows:      state,
		Quotas:       state,
		ErrorClasses: cfg.ErrorClasses,
		Logger:       s.log,
	})
	if err != nil {
		return nil, err
	}
	s.publisher = pub
	hook, err := whatsapp.NewWebhook(whatsapp.WebhookConfig{
		Credentials: creds,
		Receipts:    s.store,
		Windows:     state,
		Dedup:       state,
		Observer:    s.observer(),
		Logger:      s.log,
		OnInbound: func(_ context.Context, m whatsapp.InboundMessage) error {
			s.log.Info("inbound WhatsApp message: 24-hour window open", "org", m.Tenant, "type", m.Type)
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	s.webhook = hook
	s.ob = outbox.New(s.enqueuer(), outbox.Options{Policy: consentPolicy{s: s}, Observer: s.observer()})
	s.mux = s.routes()
	s.handler = s.measure(s.mux)
	if cfg.AdminToken != "" {
		if err := s.mountAdmin(); err != nil {
			return nil, err
		}
	}
	s.ready.Store(true)
	ok = true
	return s, nil
}

func (s *Service) enqueuer() outbox.Enqueuer[*sql.Tx] {
	switch st := s.store.(type) {
	case *postgres.Store:
		return st.SQL()
	case *mysql.Store:
		return st
	default:
		return st.(*sqlite.Store)
	}
}

func (s *Service) openStore(ctx context.Context) error {
	cfg := s.cfg
	switch cfg.Store {
	case "sqlite":
		st, err := sqlite.Open(ctx, cfg.DSN, sqlite.Options{Logger: s.log})
		if err != nil {
			return err
		}
		s.close = append(s.close, st.Close)
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		// SQLite has one writer at a time: the API's transactions queue
		// here (honouring ctx) rather than spin on the busy timeout.
		sem := make(chan struct{}, 1)
		s.store, s.db = st, st.DB()
		s.inTx = func(ctx context.Context, fn func(tx *sql.Tx) error) error {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			defer func() { <-sem }()
			return st.InTx(ctx, fn)
		}
		s.d = dialect{name: "sqlite", outboxTable: sqlite.DefaultTablePrefix + "messages"}
	case "mysql":
		db, err := sql.Open("mysql", cfg.DSN)
		if err != nil {
			return fmt.Errorf("mysql: %w", err)
		}
		s.close = append(s.close, db.Close)
		db.SetMaxOpenConns(cfg.MaxConns)
		db.SetMaxIdleConns(cfg.MaxConns)
		if err := db.PingContext(ctx); err != nil {
			return fmt.Errorf("mysql: %w", err)
		}
		st, err := mysql.New(db, mysql.Options{Logger: s.log})
		if err != nil {
			return err
		}
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		s.store, s.db, s.inTx = st, db, st.InTx
		s.d = dialect{name: "mysql", outboxTable: mysql.DefaultTablePrefix + "messages"}
	case "postgres":
		pc, err := pgxpool.ParseConfig(cfg.DSN)
		if err != nil {
			return fmt.Errorf("postgres: invalid DSN") // never echo the DSN: it may hold a password
		}
		pc.MaxConns = int32(cfg.MaxConns)
		pc.ConnConfig.RuntimeParams["search_path"] = cfg.PostgresSchema
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return fmt.Errorf("postgres: connect: %w", err)
		}
		s.pool = pool
		s.close = append(s.close, func() error { pool.Close(); return nil })
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("postgres: ping: %w", err)
		}
		st, err := postgres.New(pool, postgres.Options{Schema: cfg.PostgresSchema, Logger: s.log})
		if err != nil {
			return err
		}
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		db := stdlib.OpenDBFromPool(pool)
		s.close = append(s.close, db.Close)
		s.store, s.db = st, db
		s.inTx = func(ctx context.Context, fn func(tx *sql.Tx) error) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
		s.d = dialect{name: "postgres", outboxTable: "outbox_messages"}
	}
	return nil
}

// hashKey is how API keys are stored: hex SHA-256 (keys are long random
// strings, so a fast hash suffices; the key itself is never stored).
func hashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func (s *Service) storeAPIKeys(ctx context.Context) error {
	now := micros(time.Now())
	for _, o := range s.cfg.Orgs {
		h := o.APIKeySHA256
		if h == "" {
			h = hashKey(o.APIKey)
		}
		var org string
		err := s.db.QueryRowContext(ctx, s.d.rebind("SELECT org_id FROM msgsvc_api_keys WHERE key_hash = ?"), h).Scan(&org)
		switch {
		case err == nil && org != o.ID:
			return fmt.Errorf("config: organisation %q reuses the API key of organisation %q", o.ID, org)
		case err == nil:
		case errors.Is(err, sql.ErrNoRows):
			if _, err := s.db.ExecContext(ctx, s.d.rebind("INSERT INTO msgsvc_api_keys (key_hash, org_id, created_at) VALUES (?, ?, ?)"), h, o.ID, now); err != nil {
				return fmt.Errorf("store API key of %q: %w", o.ID, err)
			}
		default:
			return fmt.Errorf("store API key of %q: %w", o.ID, err)
		}
	}
	return nil
}

// Handler returns the service's HTTP handler (API, webhook, health,
// metrics, and the admin API when configured).
func (s *Service) Handler() http.Handler { return s.handler }

// RunProcessor publishes queued messages until ctx ends, then lets in-flight
// sends finish (DrainTimeout) and returns.
func (s *Service) RunProcessor(ctx context.Context) error {
	p, err := outbox.NewProcessor(s.store, outbox.NewRouter().Handle(Topic, s.tel.Publisher(s.publisher)), outbox.Config{
		PollInterval:      s.cfg.PollInterval,
		PollBatchSize:     s.cfg.BatchSize,
		ProcessingTimeout: s.cfg.ProcessingTimeout,
		RecoveryInterval:  s.cfg.RecoveryInterval,
		DrainTimeout:      s.cfg.DrainTimeout,
		MaxAttempts:       s.cfg.MaxAttempts,
		Backoff:           outbox.Backoff{Schedule: s.cfg.Backoff},
		Observer:          s.observer(),
		Logger:            s.log,
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.processor = p
	s.mu.Unlock()
	return p.Run(ctx)
}

// wake asks the processor to claim now (after a retry).
func (s *Service) wake() {
	s.mu.Lock()
	p := s.processor
	s.mu.Unlock()
	if p != nil {
		p.Wake()
	}
}

// Close releases the database connections. Call it after the processor
// and the HTTP server stopped.
func (s *Service) Close() error {
	s.ready.Store(false)
	var errs []error
	for i := len(s.close) - 1; i >= 0; i-- {
		errs = append(errs, s.close[i]())
	}
	s.close = nil
	return errors.Join(errs...)
}

// logObserver logs the lifecycle so a reader follows a message in the log.
type logObserver struct {
	outbox.NopObserver
	log *slog.Logger
}

func (o logObserver) OnSent(_ context.Context, e outbox.AttemptEvent) {
	o.log.Info("message SENT", "org", e.Message.Tenant, "id", e.Message.ID, "attempt", e.Attempt, "wamid", e.Message.ProviderMessageID)
}

func (o logObserver) OnFailed(_ context.Context, e outbox.AttemptEvent) {
	info := outbox.ErrorInfoOf(e.Err)
	code := ""
	if info != nil {
		code = info.Code
	}
	o.log.Warn("message FAILED", "org", e.Message.Tenant, "id", e.Message.ID, "attempt", e.Attempt, "code", code)
}

func (o logObserver) OnAttemptFinished(_ context.Context, e outbox.AttemptEvent) {
	if e.Outcome == outbox.AttemptRetry {
		o.log.Info("message QUEUED for retry", "org", e.Message.Tenant, "id", e.Message.ID, "attempt", e.Attempt, "next_attempt_at", e.NextAttemptAt)
	}
}

func (o logObserver) OnDeliveryUpdated(_ context.Context, e outbox.DeliveryEvent) {
	o.log.Info("message "+apiStatus(e.Message.Status), "org", e.Message.Tenant, "id", e.Message.ID, "receipt", string(e.Receipt.Status))
}

// SeedConsent records a GRANTED consent for (org, dossier, channel) unless
// the dossier already has a consent record for that channel (demo data).
func (s *Service) SeedConsent(ctx context.Context, org string, dossier int64, channel string) error {
	st, err := s.latestConsent(ctx, s.db, org, dossier, channel)
	if err != nil || st != "" {
		return err
	}
	_, err = s.db.ExecContext(ctx, s.d.rebind("INSERT INTO msgsvc_consents (org_id, dossier_id, channel, status, updated_at) VALUES (?, ?, ?, ?, ?)"),
		org, dossier, channel, "GRANTED", micros(time.Now()))
	return err
}
