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
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/outboxkit/examples/messaging-service/fakewa"
	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
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
	fs.StringVar(&o.dsn, "dsn", env("MSGSVC_DSN", ""), "database: SQLite file (default messaging-service.db), PostgreSQL URL or MySQL DSN (MSGSVC_DSN)")
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
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.quotaPerDay < 0 {
		return o, fmt.Errorf("-quota-per-day must not be negative")
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

	cfg := service.Config{Store: o.store, DSN: o.dsn, PostgresSchema: o.pgSchema, GraphBaseURL: o.graphURL,
		GraphAPIVersion: o.graphVersion, RedisAddr: o.redisAddr, QuotaPerDay: o.quotaPerDay, Logger: log, AdminToken: o.adminToken}
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
