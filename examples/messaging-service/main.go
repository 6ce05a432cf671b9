// Command messaging-service is the outbound messaging service of seeds 000
// and 001 on outboxkit. With no flags it runs on a SQLite file with a
// built-in fake WhatsApp Cloud API, two demo organisations and a dossier
// that has consent, so a newcomer can send a message at once and watch it
// go QUEUED -> SENT -> DELIVERED. See README.md for flags, environment
// variables and the API.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/outboxkit/examples/messaging-service/fakewa"
	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
	"github.com/outboxkit/outboxkit/whatsapp"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "messaging-service:", err)
		os.Exit(1)
	}
}

// options are the command line and environment settings (a flag wins over
// its MSGSVC_* variable).
type options struct {
	addr, store, dsn, pgSchema, orgsFile, graphURL, graphVersion, redisAddr, logFormat, adminToken string
	quotaPerDay                                                                                    int64

	// The processor (the seed's outbound.worker.* settings).
	pollInterval, staleTimeout, drainTimeout time.Duration
	batchSize, maxAttempts                   int
	backoff                                  []time.Duration
	errorClasses                             map[int]whatsapp.ErrorClass
	metrics                                  bool
}

// durationList is a flag of comma-separated durations ("1m,5m,15m").
type durationList struct{ d *[]time.Duration }

func (l durationList) String() string {
	if l.d == nil {
		return ""
	}
	var s []string
	for _, d := range *l.d {
		s = append(s, d.String())
	}
	return strings.Join(s, ",")
}

func (l durationList) Set(v string) error {
	var out []time.Duration
	for _, f := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not a positive duration (e.g. 1m,5m,15m,1h,6h)", f)
		}
		out = append(out, d)
	}
	*l.d = out
	return nil
}

// errorClassFlag is -error-classes ("131026=retryable,133004=permanent").
type errorClassFlag struct{ m *map[int]whatsapp.ErrorClass }

func (f errorClassFlag) String() string {
	if f.m == nil {
		return ""
	}
	var s []string
	for _, c := range slices.Sorted(maps.Keys(*f.m)) {
		s = append(s, fmt.Sprintf("%d=%s", c, (*f.m)[c]))
	}
	return strings.Join(s, ",")
}

func (f errorClassFlag) Set(v string) error {
	m, err := whatsapp.ParseErrorClasses(v)
	if err != nil {
		return err
	}
	*f.m = m
	return nil
}

func parse(args []string, getenv func(string) string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("messaging-service", flag.ContinueOnError)
	fs.SetOutput(out)
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	var o options
	fs.StringVar(&o.addr, "addr", env("MSGSVC_ADDR", "127.0.0.1:8080"), "listen address (MSGSVC_ADDR)")
	fs.StringVar(&o.store, "store", env("MSGSVC_STORE", "sqlite"), "sqlite, postgres or mysql (MSGSVC_STORE)")
	fs.StringVar(&o.dsn, "dsn", env("MSGSVC_DSN", ""), "database: SQLite file (default: messaging-service.db in the user's cache directory, $XDG_CACHE_HOME/outboxkit), PostgreSQL URL or MySQL DSN (MSGSVC_DSN)")
	fs.StringVar(&o.pgSchema, "pg-schema", env("MSGSVC_PG_SCHEMA", "public"), "PostgreSQL schema (MSGSVC_PG_SCHEMA)")
	fs.StringVar(&o.orgsFile, "orgs", env("MSGSVC_ORGS_FILE", ""), "JSON file of organisations: API keys and WhatsApp credentials (MSGSVC_ORGS_FILE); empty: demo organisations")
	fs.StringVar(&o.graphURL, "graph-url", env("MSGSVC_GRAPH_URL", ""), "WhatsApp Cloud API root, e.g. https://graph.facebook.com (MSGSVC_GRAPH_URL); empty: the built-in fake")
	fs.StringVar(&o.graphVersion, "graph-version", env("MSGSVC_GRAPH_VERSION", ""), "Graph API version, e.g. v25.0 (MSGSVC_GRAPH_VERSION)")
	fs.StringVar(&o.redisAddr, "redis", env("MSGSVC_REDIS_ADDR", ""), "Redis address for 24-hour windows and quotas (MSGSVC_REDIS_ADDR); empty: the database")
	quota, err := strconv.ParseInt(env("MSGSVC_QUOTA_PER_DAY", "0"), 10, 64)
	if err != nil || quota < 0 {
		return o, fmt.Errorf("MSGSVC_QUOTA_PER_DAY must be a non-negative integer")
	}
	fs.Int64Var(&o.quotaPerDay, "quota-per-day", quota, "WhatsApp messages per organisation per 24 hours (MSGSVC_QUOTA_PER_DAY); 0: 1000")
	fs.StringVar(&o.logFormat, "log-format", env("MSGSVC_LOG_FORMAT", "text"), "text or json (MSGSVC_LOG_FORMAT)")
	fs.StringVar(&o.adminToken, "admin-token", env("MSGSVC_ADMIN_TOKEN", ""), "serve the outbox admin API and dashboard under /admin/ to this token, at least 16 characters (MSGSVC_ADMIN_TOKEN; prefer the variable: a flag shows in the process list); empty: not served, or the demo token in demo mode")
	// The processor's settings: defaults are the service's (the seeds').
	var envErr error
	durEnv := func(k string) time.Duration {
		v := getenv(k)
		if v == "" {
			return 0
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			envErr = errors.Join(envErr, fmt.Errorf("%s must be a positive duration such as 500ms or 2m", k))
		}
		return d
	}
	intEnv := func(k string) int {
		v := getenv(k)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			envErr = errors.Join(envErr, fmt.Errorf("%s must be a positive integer", k))
		}
		return n
	}
	fs.DurationVar(&o.pollInterval, "poll-interval", durEnv("MSGSVC_POLL_INTERVAL"), "the processor's longest wait between claims; new messages wake it at once (MSGSVC_POLL_INTERVAL; seed poll-interval-ms); 0: 1s")
	fs.IntVar(&o.batchSize, "batch-size", intEnv("MSGSVC_BATCH_SIZE"), "most messages claimed at once (MSGSVC_BATCH_SIZE; seed batch-size); 0: 500")
	fs.IntVar(&o.maxAttempts, "max-attempts", intEnv("MSGSVC_MAX_ATTEMPTS"), "publish attempts before a message is FAILED (MSGSVC_MAX_ATTEMPTS; seed maxAttempts); 0: 5")
	if v := getenv("MSGSVC_BACKOFF"); v != "" {
		if err := (durationList{&o.backoff}).Set(v); err != nil {
			envErr = errors.Join(envErr, fmt.Errorf("MSGSVC_BACKOFF: %w", err))
		}
	}
	fs.Var(durationList{&o.backoff}, "backoff", "retry delays after each failed attempt, comma-separated, the last repeating (MSGSVC_BACKOFF; seed BACKOFF_MINUTES); default 1m,5m,15m,1h,6h")
	fs.DurationVar(&o.staleTimeout, "stale-timeout", durEnv("MSGSVC_STALE_TIMEOUT"), "lease after which a message SENDING in a dead processor is QUEUED again (MSGSVC_STALE_TIMEOUT; seed stale recovery); 0: 10m")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", durEnv("MSGSVC_DRAIN_TIMEOUT"), "at shutdown, how long in-flight sends may finish; shorter than -stale-timeout (MSGSVC_DRAIN_TIMEOUT); 0: 10s")
	if v := getenv("MSGSVC_ERROR_CLASSES"); v != "" {
		if err := (errorClassFlag{&o.errorClasses}).Set(v); err != nil {
			envErr = errors.Join(envErr, fmt.Errorf("MSGSVC_ERROR_CLASSES: %w", err))
		}
	}
	fs.Var(errorClassFlag{&o.errorClasses}, "error-classes", "override WhatsApp error codes' class, e.g. 131026=retryable,133004=permanent (MSGSVC_ERROR_CLASSES)")
	metricsDefault := true
	if v := getenv("MSGSVC_METRICS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			envErr = errors.Join(envErr, errors.New("MSGSVC_METRICS must be true or false"))
		}
		metricsDefault = b
	}
	fs.BoolVar(&o.metrics, "metrics", metricsDefault, "serve Prometheus metrics at /metrics (MSGSVC_METRICS)")
	if envErr != nil {
		return o, envErr
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.quotaPerDay < 0 {
		return o, fmt.Errorf("-quota-per-day must not be negative")
	}
	if o.pollInterval < 0 || o.staleTimeout < 0 || o.drainTimeout < 0 {
		return o, errors.New("-poll-interval, -stale-timeout and -drain-timeout must not be negative")
	}
	if o.batchSize < 0 || o.maxAttempts < 0 {
		return o, errors.New("-batch-size and -max-attempts must not be negative")
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return o, fmt.Errorf("-log-format must be text or json")
	}
	if o.adminToken != "" && len(o.adminToken) < 16 {
		return o, errors.New("-admin-token must be at least 16 characters")
	}
	if o.orgsFile == "" && o.graphURL != "" {
		return o, errors.New("-graph-url needs -orgs: the real Cloud API needs each organisation's credentials")
	}
	return o, nil
}

// demoKeys are the demo organisations' API keys, used only when no -orgs
// file is given (and so only with the fake Cloud API).
var demoKeys = map[string]string{"org-1": "demo-key-org-1-0123456789", "org-2": "demo-key-org-2-0123456789"}

// demoAdminToken opens the admin dashboard in demo mode, when no
// -admin-token is given.
const demoAdminToken = "demo-admin-0123456789"

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	o, err := parse(args, getenv, out)
	if err != nil {
		return err
	}
	var h slog.Handler = slog.NewTextHandler(out, nil)
	if o.logFormat == "json" {
		h = slog.NewJSONHandler(out, nil)
	}
	log := slog.New(h)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	base := "http://" + ln.Addr().String()

	if o.dsn == "" && (o.store == "" || o.store == "sqlite") {
		// Not the working directory: a run from a source checkout would
		// leave its database there.
		o.dsn = service.DefaultSQLitePath()
		if x := getenv("XDG_CACHE_HOME"); x != "" {
			o.dsn = filepath.Join(x, "outboxkit", "messaging-service.db")
		}
		if err := os.MkdirAll(filepath.Dir(o.dsn), 0o700); err != nil {
			return err
		}
		log.Info("SQLite database", "path", o.dsn)
	}
	cfg := service.Config{Store: o.store, DSN: o.dsn, PostgresSchema: o.pgSchema, GraphBaseURL: o.graphURL,
		GraphAPIVersion: o.graphVersion, RedisAddr: o.redisAddr, QuotaPerDay: o.quotaPerDay, Logger: log, AdminToken: o.adminToken,
		PollInterval: o.pollInterval, BatchSize: o.batchSize, MaxAttempts: o.maxAttempts, Backoff: o.backoff,
		ProcessingTimeout: o.staleTimeout, DrainTimeout: o.drainTimeout, ErrorClasses: o.errorClasses, DisableMetrics: !o.metrics}
	demo := o.orgsFile == ""
	if demo && cfg.AdminToken == "" {
		cfg.AdminToken = demoAdminToken
	}
	var fake *fakewa.Server
	if demo {
		phones := map[string]fakewa.Phone{}
		for i, id := range []string{"org-1", "org-2"} {
			p := fakewa.Phone{AccessToken: randomHex(), AppSecret: randomHex()}
			phoneID := fmt.Sprintf("10000000000000%d", i+1)
			phones[phoneID] = p
			org := service.Org{ID: id, APIKey: demoKeys[id]}
			org.WhatsApp.PhoneNumberID, org.WhatsApp.AccessToken, org.WhatsApp.AppSecret = phoneID, p.AccessToken, p.AppSecret
			org.WhatsApp.VerifyToken = "demo-verify-" + id
			cfg.Orgs = append(cfg.Orgs, org)
		}
		fake, err = fakewa.Start("127.0.0.1:0", fakewa.Config{Phones: phones, WebhookURL: base + service.WebhookPath, Logger: log})
		if err != nil {
			return err
		}
		defer fake.Close()
		cfg.GraphBaseURL = fake.URL()
		log.Info("demo mode: fake WhatsApp Cloud API", "url", fake.URL(), "orgs", "org-1, org-2")
	} else {
		b, err := os.ReadFile(o.orgsFile)
		if err != nil {
			return err
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg.Orgs); err != nil {
			return fmt.Errorf("%s: %w", o.orgsFile, err)
		}
		if cfg.GraphBaseURL == "" {
			return errors.New("-orgs needs -graph-url (https://graph.facebook.com, or a fake's URL)")
		}
	}

	svc, err := service.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	if demo {
		if err := svc.SeedConsent(ctx, "org-1", 42, "WHATSAPP"); err != nil {
			return err
		}
	}

	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	procCtx, cancelProc := context.WithCancel(context.WithoutCancel(ctx))
	procDone := make(chan error, 1)
	go func() { procDone <- svc.RunProcessor(procCtx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()

	log.Info("messaging-service listening", "url", base, "store", cfg.Store)
	if demo {
		fmt.Fprintf(out, "\nTry it (org-1, dossier 42 has WhatsApp consent):\n\n"+
			"  curl -s -X POST %s/api/v1/outbound/messages -H 'Authorization: Bearer %s' -H 'X-Org-Id: org-1' "+
			"-H 'Content-Type: application/json' -d '{\"dossierId\":42,\"channel\":\"WHATSAPP\",\"to\":\"+33612345678\",\"templateCode\":\"hello_world\",\"payloadJson\":{\"language\":\"en_US\"}}'\n\n"+
			"then GET %s/api/v1/outbound/messages/{id} with the same headers (QUEUED -> SENT -> DELIVERED).\n\n",
			base, demoKeys["org-1"], base)
		if cfg.AdminToken == demoAdminToken {
			fmt.Fprintf(out, "The outbox dashboard: %s%s (any user name, password %s).\n\n", base, service.AdminPath, demoAdminToken)
		}
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: no new requests, draining")
	case runErr = <-srvDone:
	case runErr = <-procDone:
		procDone <- runErr
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil && runErr == nil {
		runErr = err
	}
	cancelProc()
	if err := <-procDone; err != nil && runErr == nil {
		runErr = err
	}
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	log.Info("messaging-service stopped")
	return runErr
}
