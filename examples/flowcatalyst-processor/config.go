package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	seedmongo "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mongo"
	seedmysql "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mysql"
	seedpostgres "github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
)

// envPrefix turns a key into its environment variable: poll-interval is
// OUTBOX_PROCESSOR_POLL_INTERVAL (the seed's outbox-processor.poll-interval).
const envPrefix = "OUTBOX_PROCESSOR_"

func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// config is the processor's configuration: seed 004's keys plus what
// outboxkit adds (database-url, api-version, OAuth, backoff, logging).
type config struct {
	Enabled                  bool
	PollInterval             time.Duration
	PollBatchSize            int
	APIBatchSize             int
	MaxConcurrentGroups      int
	GlobalBufferSize         int
	DatabaseType             string
	EventsTable              string
	DispatchJobsTable        string
	APIBaseURL               string
	APIToken                 string
	MaxRetries               int
	ProcessingTimeoutSeconds int
	MongoDatabase            string

	DatabaseURL      string
	APIVersion       string
	APITokenURL      string
	APIClientID      string
	APIClientSecret  string
	APIScopes        string
	RetryBackoff     string
	RecoveryInterval time.Duration
	DrainTimeout     time.Duration
	CreateTables     bool
	SingleActive     bool
	LogLevel         string
	LogFormat        string

	NullGroupUnordered    bool
	RecoveryCountsAttempt bool
	FailedRequestCharges  string

	mysql    bool   // database-type MYSQL
	mysqlDSN string // database-url as the MySQL driver's DSN
	mongo    bool   // database-type MONGODB

	api     flowcatalyst.API
	backoff []time.Duration
}

// option is one configuration key: a flag and an environment variable.
type option struct {
	key, usage string
	def        string
	isBool     bool
	set        func(c *config, v string) error
}

func boolVal(dst *bool) func(string) error {
	return func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		*dst = b
		return nil
	}
}

func intVal(dst *int) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%q is not a whole number", v)
		}
		*dst = n
		return nil
	}
}

// durationVal accepts Go durations (1s, 500ms) and the seed's ISO-8601 ones
// (PT1S, PT0.5S, PT5M).
func durationVal(dst *time.Duration) func(string) error {
	return func(v string) error {
		d, err := parseDuration(v)
		if err != nil {
			return err
		}
		*dst = d
		return nil
	}
}

func parseDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if u := strings.ToUpper(v); strings.HasPrefix(u, "PT") {
		d, err := time.ParseDuration(strings.ToLower(u[2:]))
		if err == nil {
			return d, nil
		}
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (e.g. 1s, 500ms, PT1S)", v)
	}
	return d, nil
}

func stringVal(dst *string) func(string) error {
	return func(v string) error { *dst = strings.TrimSpace(v); return nil }
}

func options() []option {
	o := func(key, def, usage string, set func(c *config) func(string) error) option {
		return option{key: key, def: def, usage: usage, set: func(c *config, v string) error { return set(c)(v) }}
	}
	b := func(key, def, usage string, set func(c *config) func(string) error) option {
		opt := o(key, def, usage, set)
		opt.isBool = true
		return opt
	}
	return []option{
		// Seed 004's keys (outbox-processor.*).
		b("enabled", "true", "process the outbox tables (false: idle until stopped)", func(c *config) func(string) error { return boolVal(&c.Enabled) }),
		o("poll-interval", "1s", "polling frequency", func(c *config) func(string) error { return durationVal(&c.PollInterval) }),
		o("poll-batch-size", "500", "most rows claimed per poll", func(c *config) func(string) error { return intVal(&c.PollBatchSize) }),
		o("api-batch-size", "100", "most items per FlowCatalyst request", func(c *config) func(string) error { return intVal(&c.APIBatchSize) }),
		o("max-concurrent-groups", "10", "most message groups sending at once", func(c *config) func(string) error { return intVal(&c.MaxConcurrentGroups) }),
		o("global-buffer-size", "1000", "most claimed rows held in memory", func(c *config) func(string) error { return intVal(&c.GlobalBufferSize) }),
		o("database-type", "POSTGRESQL", "POSTGRESQL, MYSQL (MySQL 8, MariaDB 10.6+) or MONGODB", func(c *config) func(string) error { return stringVal(&c.DatabaseType) }),
		o("events-table", "outbox_events", "events table (MongoDB: collection), optionally schema.table", func(c *config) func(string) error { return stringVal(&c.EventsTable) }),
		o("dispatch-jobs-table", "outbox_dispatch_jobs", "dispatch jobs table (MongoDB: collection), optionally schema.table", func(c *config) func(string) error { return stringVal(&c.DispatchJobsTable) }),
		o("api-base-url", "", "FlowCatalyst URL, e.g. https://flowcatalyst.example.com (required)", func(c *config) func(string) error { return stringVal(&c.APIBaseURL) }),
		o("api-token", "", "static bearer token (or use api-token-url)", func(c *config) func(string) error { return stringVal(&c.APIToken) }),
		o("max-retries", "3", "retries after the first attempt before a row is FAILED", func(c *config) func(string) error { return intVal(&c.MaxRetries) }),
		o("processing-timeout-seconds", "300", "a PROCESSING row older than this is recovered", func(c *config) func(string) error { return intVal(&c.ProcessingTimeoutSeconds) }),
		o("mongo-database", "outbox", "MongoDB database holding the collections (database-type MONGODB)", func(c *config) func(string) error { return stringVal(&c.MongoDatabase) }),
		// outboxkit's additions.
		o("database-url", "", "the database: postgres://user:pass@host:5432/app; with database-type MYSQL mysql://user:pass@host:3306/app or a Go MySQL DSN user:pass@tcp(host:3306)/app; with MONGODB mongodb://user:pass@host:27017/?replicaSet=rs0 (required)", func(c *config) func(string) error { return stringVal(&c.DatabaseURL) }),
		o("api-version", "current", "FlowCatalyst API generation: current ({\"items\":[...]}, /api/dispatch-jobs/batch) or seed (bare array, /api/dispatch/jobs/batch)", func(c *config) func(string) error { return stringVal(&c.APIVersion) }),
		o("api-token-url", "", "OAuth2 token endpoint for the client-credentials grant", func(c *config) func(string) error { return stringVal(&c.APITokenURL) }),
		o("api-client-id", "", "OAuth2 client id", func(c *config) func(string) error { return stringVal(&c.APIClientID) }),
		o("api-client-secret", "", "OAuth2 client secret", func(c *config) func(string) error { return stringVal(&c.APIClientSecret) }),
		o("api-scopes", "", "OAuth2 scopes, space separated", func(c *config) func(string) error { return stringVal(&c.APIScopes) }),
		o("retry-backoff", "5s,30s,2m", "delays before retry 1, 2, ... (the last repeats)", func(c *config) func(string) error { return stringVal(&c.RetryBackoff) }),
		o("recovery-interval", "1m", "how often stuck PROCESSING rows are looked for", func(c *config) func(string) error { return durationVal(&c.RecoveryInterval) }),
		o("drain-timeout", "30s", "on SIGTERM, how long in-flight requests may finish", func(c *config) func(string) error { return durationVal(&c.DrainTimeout) }),
		b("create-tables", "false", "create the seed's tables when missing", func(c *config) func(string) error { return boolVal(&c.CreateTables) }),
		b("single-active", "false", "only one processor works at a time (PostgreSQL advisory lock, MySQL GET_LOCK, MongoDB lease document)", func(c *config) func(string) error { return boolVal(&c.SingleActive) }),
		o("log-level", "info", "debug, info, warn or error", func(c *config) func(string) error { return stringVal(&c.LogLevel) }),
		o("log-format", "json", "json or text", func(c *config) func(string) error { return stringVal(&c.LogFormat) }),
		// Departures from the seed's behaviour, off by default.
		b("null-group-unordered", "false", "send rows with a NULL message_group unordered, in parallel (seed: they form the one FIFO group \"default\")", func(c *config) func(string) error { return boolVal(&c.NullGroupUnordered) }),
		b("recovery-counts-attempt", "false", "a recovered stuck PROCESSING row uses up an attempt and may become FAILED (seed: it keeps its retry_count)", func(c *config) func(string) error { return boolVal(&c.RecoveryCountsAttempt) }),
		o("failed-request-charges", "all", "which items a failed request (HTTP error, timeout) charges a retry: all (seed) or first (only the first item of each group; the rest wait without using attempts)", func(c *config) func(string) error { return stringVal(&c.FailedRequestCharges) }),
	}
}

// loadConfig reads defaults, then environment variables, then flags (the
// last wins), and validates the result. Every problem is reported, each
// naming its flag and variable.
func loadConfig(args []string, getenv func(string) string, usageOut io.Writer) (config, error) {
	var c config
	var problems []string
	opts := options()
	for _, o := range opts {
		if err := o.set(&c, o.def); err != nil {
			problems = append(problems, fmt.Sprintf("default of %s: %v", o.key, err))
		}
		if v := getenv(envName(o.key)); v != "" {
			if err := o.set(&c, v); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", envName(o.key), err))
			}
		}
	}
	fs := flag.NewFlagSet("flowcatalyst-processor", flag.ContinueOnError)
	// Usage goes out for -h only; a bad flag is one problem among the others.
	fs.SetOutput(io.Discard)
	for _, o := range opts {
		usage := fmt.Sprintf("%s (env %s, default %q)", o.usage, envName(o.key), o.def)
		// A bad value is recorded and parsing goes on, so that every
		// problem is listed at once.
		set := func(v string) error {
			if err := o.set(&c, v); err != nil {
				problems = append(problems, fmt.Sprintf("-%s: %v", o.key, err))
			}
			return nil
		}
		if o.isBool {
			fs.BoolFunc(o.key, usage, set)
		} else {
			fs.Func(o.key, usage, set)
		}
	}
	for rest := args; ; {
		err := fs.Parse(rest)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usageOut)
			fs.Usage()
			return c, err
		}
		if err != nil {
			problems = append(problems, err.Error())
			// Go on after the bad flag (and its value, if it had one).
			i := len(rest) - len(fs.Args())
			if i < 1 {
				i = 1
			}
			rest = rest[min(i, len(rest)):]
			if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
				rest = rest[1:]
			}
			if len(rest) == 0 {
				break
			}
			continue
		}
		if fs.NArg() > 0 {
			problems = append(problems, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
		}
		break
	}
	problems = append(problems, c.validate()...)
	if len(problems) > 0 {
		return c, &configError{problems: problems}
	}
	return c, nil
}

type configError struct{ problems []string }

func (e *configError) Error() string {
	return "invalid configuration:\n  - " + strings.Join(e.problems, "\n  - ")
}

func (c *config) validate() []string {
	var p []string
	name := func(key string) string { return fmt.Sprintf("%s (-%s or %s)", key, key, envName(key)) }
	positive := func(key string, v int) {
		if v < 1 {
			p = append(p, fmt.Sprintf("%s must be positive, got %d", name(key), v))
		}
	}
	positive("poll-batch-size", c.PollBatchSize)
	positive("api-batch-size", c.APIBatchSize)
	positive("max-concurrent-groups", c.MaxConcurrentGroups)
	positive("global-buffer-size", c.GlobalBufferSize)
	positive("processing-timeout-seconds", c.ProcessingTimeoutSeconds)
	if c.MaxRetries < 0 || c.MaxRetries > 999 {
		p = append(p, fmt.Sprintf("%s must be between 0 and 999, got %d", name("max-retries"), c.MaxRetries))
	}
	for key, d := range map[string]time.Duration{"poll-interval": c.PollInterval, "recovery-interval": c.RecoveryInterval, "drain-timeout": c.DrainTimeout} {
		if d <= 0 {
			p = append(p, fmt.Sprintf("%s must be positive, got %s", name(key), d))
		}
	}
	if lease := time.Duration(c.ProcessingTimeoutSeconds) * time.Second; c.ProcessingTimeoutSeconds > 0 && c.DrainTimeout >= lease {
		// A send still draining when its lease expires would be sent again
		// by another replica.
		p = append(p, fmt.Sprintf("%s (%s) must be shorter than %s (%s)", name("drain-timeout"), c.DrainTimeout, name("processing-timeout-seconds"), lease))
	}
	c.mysql, c.mongo = false, false
	switch strings.ToUpper(c.DatabaseType) {
	case "POSTGRESQL", "POSTGRES":
	case "MYSQL", "MARIADB":
		c.mysql = true
	case "MONGODB", "MONGO":
		c.mongo = true
	default:
		p = append(p, fmt.Sprintf("%s must be POSTGRESQL, MYSQL or MONGODB, got %q", name("database-type"), c.DatabaseType))
	}
	switch {
	case c.DatabaseURL == "":
		p = append(p, name("database-url")+" is required")
	case c.mysql:
		dsn, err := mysqlDSN(c.DatabaseURL)
		if err != nil {
			p = append(p, name("database-url")+" must be a mysql:// URL or a MySQL DSN (user:pass@tcp(host:3306)/app) with database-type MYSQL")
		}
		c.mysqlDSN = dsn
	case c.mongo:
		if u, err := url.Parse(c.DatabaseURL); err != nil || (u.Scheme != "mongodb" && u.Scheme != "mongodb+srv") || u.Host == "" {
			p = append(p, name("database-url")+" must be a mongodb:// or mongodb+srv:// URL with database-type MONGODB")
		}
		if err := seedmongo.CheckCollectionName(c.MongoDatabase); err != nil || c.MongoDatabase == "" || strings.ContainsAny(c.MongoDatabase, `/\. "*<>:|?`) {
			p = append(p, fmt.Sprintf("%s is %q: not a MongoDB database name", name("mongo-database"), c.MongoDatabase))
		}
	default:
		if u, err := url.Parse(c.DatabaseURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			p = append(p, name("database-url")+" must be a postgres:// URL")
		}
	}
	if c.APIBaseURL == "" {
		p = append(p, name("api-base-url")+" is required")
	} else if u, err := url.Parse(c.APIBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p = append(p, name("api-base-url")+" must be an http(s) URL")
	}
	api, err := flowcatalyst.APIByName(c.APIVersion)
	if err != nil {
		p = append(p, fmt.Sprintf("%s must be current or seed, got %q", name("api-version"), c.APIVersion))
	} else {
		c.api = api
		if c.APIBatchSize > api.MaxBatchSize {
			p = append(p, fmt.Sprintf("%s is %d, but the %s API accepts at most %d items per request", name("api-batch-size"), c.APIBatchSize, c.APIVersion, api.MaxBatchSize))
		}
	}
	if c.APIToken != "" && c.APITokenURL != "" {
		p = append(p, fmt.Sprintf("set either %s or %s, not both", name("api-token"), name("api-token-url")))
	}
	if c.APITokenURL != "" && c.APIClientID == "" {
		p = append(p, name("api-client-id")+" is required with api-token-url")
	}
	if (c.APIClientID != "" || c.APIClientSecret != "") && c.APITokenURL == "" {
		p = append(p, name("api-token-url")+" is required with api-client-id/api-client-secret")
	}
	c.backoff = nil
	for _, part := range strings.Split(c.RetryBackoff, ",") {
		d, err := parseDuration(part)
		if err != nil || d < 0 {
			p = append(p, fmt.Sprintf("%s: %v", name("retry-backoff"), errors.Join(err, errIf(d < 0, "negative delay"))))
			break
		}
		c.backoff = append(c.backoff, d)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		p = append(p, fmt.Sprintf("%s must be debug, info, warn or error, got %q", name("log-level"), c.LogLevel))
	}
	for _, tk := range []struct{ key, name string }{{"events-table", c.EventsTable}, {"dispatch-jobs-table", c.DispatchJobsTable}} {
		switch {
		case c.mongo:
			if err := seedmongo.CheckCollectionName(tk.name); err != nil || tk.name == "" || tk.name == seedmongo.DefaultLocksCollection {
				p = append(p, fmt.Sprintf("%s is %q: not a collection name (at most 120 bytes, no $, not system.*, not %s)", name(tk.key), tk.name, seedmongo.DefaultLocksCollection))
			}
		default:
			if err := seedpostgres.CheckTableName(tk.name); err != nil {
				p = append(p, fmt.Sprintf("%s is %q: letters, digits and _ only, optionally schema.table", name(tk.key), tk.name))
			}
		}
	}
	if strings.EqualFold(c.EventsTable, c.DispatchJobsTable) {
		p = append(p, fmt.Sprintf("%s and %s must differ, both are %q", name("events-table"), name("dispatch-jobs-table"), c.EventsTable))
	}
	switch strings.ToLower(c.FailedRequestCharges) {
	case "all", "first":
	default:
		p = append(p, fmt.Sprintf("%s must be all or first, got %q", name("failed-request-charges"), c.FailedRequestCharges))
	}
	switch strings.ToLower(c.LogFormat) {
	case "json", "text":
	default:
		p = append(p, fmt.Sprintf("%s must be json or text, got %q", name("log-format"), c.LogFormat))
	}
	return p
}

func errIf(cond bool, msg string) error {
	if cond {
		return errors.New(msg)
	}
	return nil
}

// mysqlDSN turns database-url into the DSN the MySQL store needs: a
// mysql://user:pass@host:port/db?param=value URL or a Go MySQL DSN, plus
// parseTime, loc=UTC and time_zone '+00:00' (seedmysql.DSN). Errors
// never repeat the URL (it may hold a password).
func mysqlDSN(s string) (string, error) {
	if strings.HasPrefix(s, "mysql://") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || strings.Trim(u.Path, "/") == "" {
			return "", errors.New("not a mysql://user:pass@host:port/db URL")
		}
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr = "tcp", u.Host
		if u.Port() == "" {
			cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
		cfg.DBName = strings.Trim(u.Path, "/")
		s = cfg.FormatDSN()
		if u.RawQuery != "" {
			s += "?" + u.RawQuery
		}
	}
	return seedmysql.DSN(s)
}
