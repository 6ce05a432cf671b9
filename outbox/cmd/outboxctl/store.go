package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
	"github.com/outboxkit/outboxkit/store/mysql"
	"github.com/outboxkit/outboxkit/store/postgres"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

var (
	errHelp  = errors.New("help shown")
	errFlags = errors.New("bad flags")
)

// conn holds the connection flags every command takes.
type conn struct {
	url, prefix, schema string
	mode                openMode
}

// openMode says what a command may find and create when it opens a store.
type openMode int

const (
	// needSchema: the command works on messages; a database without the
	// outboxkit schema answers errNotMigrated and nothing is created.
	needSchema openMode = iota
	// inspect: migrate status and down; no schema is not an error, but
	// nothing is created (no SQLite file).
	inspect
	// create: migrate up, the one command that creates a SQLite file.
	create
	// render: migrate sql; no server is contacted, nothing is created.
	render
)

func (c *conn) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", os.Getenv("OUTBOXCTL_URL"), "store URL: postgres://…, mysql://…, sqlite:///path, mongodb://host/db (default $OUTBOXCTL_URL)")
	fs.StringVar(&c.prefix, "prefix", "", "table (MongoDB: collection) prefix (default the store's, outbox_)")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema (default public)")
}

// parse parses args into fs, flags and words in any order, mapping -h and
// flag errors to errHelp and errFlags. The words fill positional in turn;
// a word beyond them is bad usage: a command never ignores what it was
// told (a stray word before --dry-run must not turn a dry run into a real
// one).
func parse(fs *flag.FlagSet, args []string, positional ...*string) error {
	fs.SetOutput(io.Discard)
	n := 0
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			fs.SetOutput(os.Stderr)
			fs.PrintDefaults()
			return errHelp
		case err != nil:
			return fmt.Errorf("%w: %v", errFlags, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return nil
		}
		// After "--" every word is a word, flag-like or not.
		words := rest[:1]
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			words = rest
		}
		for _, w := range words {
			if n == len(positional) {
				return usagef("%s: unexpected argument %q (nothing was done)", fs.Name(), w)
			}
			*positional[n] = w
			n++
		}
		args = rest[len(words):]
	}
}

// onlyFlags refuses, as bad usage, a flag that was set on fs but is not
// one of allowed: a flag that does not apply is a mistake, not a no-op.
func onlyFlags(fs *flag.FlagSet, what string, allowed ...string) error {
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if !slices.Contains(allowed, f.Name) && !slices.Contains([]string{"url", "prefix", "schema"}, f.Name) {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return usagef("%s does not take %s (nothing was done)", what, strings.Join(bad, ", "))
	}
	return nil
}

// migrator is what every store offers for its schema.
type migrator interface {
	Migrate(ctx context.Context) error
	MigrateTo(ctx context.Context, target int) error
	SchemaVersion(ctx context.Context) (int, error)
}

// migration is one store migration, whatever the store's type for it.
type migration struct {
	Version  int
	Name     string
	Up, Down string
}

// target is an opened store.
type target struct {
	kind       string // postgres, mysql, sqlite, mongo
	store      outbox.Store
	migrator   migrator
	migrations []migration
	// preamble is SQL that `migrate sql` prints first (PostgreSQL's
	// CREATE SCHEMA, which Migrate runs itself).
	preamble string
	// script names the migrations' language for `migrate sql`: its line
	// comment and file extension ("--", "sql"; "//", "js" for mongosh).
	comment, ext string
	close        func()
}

// admin returns the store's outbox.Admin.
func (t *target) admin() (outbox.Admin, error) {
	a, ok := t.store.(outbox.Admin)
	if !ok {
		return nil, outbox.ErrNotAdmin
	}
	return a, nil
}

var userinfoRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*://[^:@/]*):([^@]*)@`)

// redact removes the password of a URL for messages, also of one that
// net/url cannot parse (a MongoDB URL with several hosts).
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return userinfoRE.ReplaceAllString(raw, "${1}:xxxxx@")
	}
	if u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// open connects to the store c.url names and, in needSchema mode, checks
// that its schema is there.
func (c *conn) open(ctx context.Context) (*target, error) {
	t, err := c.connect(ctx)
	if err != nil || c.mode != needSchema {
		return t, err
	}
	v, err := t.migrator.SchemaVersion(ctx)
	if err != nil {
		t.close()
		return nil, err
	}
	if v == 0 {
		t.close()
		return nil, fmt.Errorf("%s %s: no outboxkit schema: %w", t.kind, redact(c.url), errNotMigrated)
	}
	return t, nil
}

// connect connects to the store c.url names.
func (c *conn) connect(ctx context.Context) (*target, error) {
	if c.url == "" {
		return nil, usagef("--url (or OUTBOXCTL_URL) is required")
	}
	scheme, rest, ok := strings.Cut(c.url, ":")
	if !ok {
		return nil, usagef("--url %q has no scheme (postgres://, mysql://, sqlite:, mongodb://)", redact(c.url))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		pool, err := pgxpool.New(ctx, c.url)
		if err != nil {
			return nil, fmt.Errorf("postgres: %s: %w", redact(c.url), err)
		}
		st, err := postgres.New(pool, postgres.Options{Schema: c.schema, TablePrefix: c.prefix})
		if err != nil {
			pool.Close()
			return nil, err
		}
		t := &target{kind: "postgres", store: st, migrator: st, close: pool.Close,
			preamble: "CREATE SCHEMA IF NOT EXISTS " + st.Schema() + ";\n"}
		for _, m := range st.Migrations() {
			t.migrations = append(t.migrations, migration{m.Version, m.Name, m.Up, m.Down})
		}
		return t, nil
	case "mysql", "mariadb":
		dsn, err := mysqlDSN(c.url)
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return nil, fmt.Errorf("mysql: %s: %w", redact(c.url), err)
		}
		st, err := mysql.New(db, mysql.Options{TablePrefix: c.prefix})
		if err != nil {
			db.Close()
			return nil, err
		}
		t := &target{kind: "mysql", store: st, migrator: st, close: func() { db.Close() }}
		for _, m := range st.Migrations() {
			t.migrations = append(t.migrations, migration{m.Version, m.Name, m.Up, m.Down})
		}
		return t, nil
	case "sqlite", "file":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, usagef("--url %q names no file (sqlite:///path/to/file.db)", c.url)
		}
		cleanup := func() {}
		switch _, err := os.Stat(path); {
		case c.mode == render:
			// Render from a scratch file: the named one is not created.
			dir, err := os.MkdirTemp("", "outboxctl")
			if err != nil {
				return nil, err
			}
			path, cleanup = filepath.Join(dir, "render.db"), func() { _ = os.RemoveAll(dir) }
		case errors.Is(err, fs.ErrNotExist) && c.mode != create:
			// sqlite.Open would create it: a mistyped path must not
			// leave an empty database behind.
			return nil, fmt.Errorf("sqlite: %s does not exist: %w", path, errNotMigrated)
		}
		st, err := sqlite.Open(ctx, path, sqlite.Options{TablePrefix: c.prefix})
		if err != nil {
			cleanup()
			return nil, err
		}
		t := &target{kind: "sqlite", store: st, migrator: st, close: func() { st.Close(); cleanup() }}
		for _, m := range st.Migrations() {
			t.migrations = append(t.migrations, migration{m.Version, m.Name, m.Up, m.Down})
		}
		return t, nil
	case "mongodb", "mongodb+srv":
		return c.openMongo(ctx)
	}
	return nil, usagef("--url scheme %q is not supported (postgres, mysql, sqlite, mongodb)", scheme)
}

// openMongo connects to the MongoDB (or compatible) server of c.url and
// opens the store in the database the URL's path names.
func (c *conn) openMongo(ctx context.Context) (*target, error) {
	cs, err := connstring.Parse(c.url)
	if err != nil {
		return nil, usagef("--url %q: %v", redact(c.url), redactErr(err, c.url))
	}
	if cs.Database == "" {
		return nil, usagef("--url %q names no database (mongodb://host:27017/db)", redact(c.url))
	}
	if c.schema != "" {
		return nil, usagef("--schema is for PostgreSQL; a MongoDB URL names its database in its path")
	}
	client, err := mongodrv.Connect(options.Client().ApplyURI(c.url).SetTimeout(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("mongodb: %s: %v", redact(c.url), redactErr(err, c.url))
	}
	closeClient := func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }
	if c.mode != render {
		pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := client.Ping(pctx, nil); err != nil {
			closeClient()
			return nil, fmt.Errorf("mongodb: %s: %v", redact(c.url), redactErr(err, c.url))
		}
	}
	st, err := mongo.New(client.Database(cs.Database), mongo.Options{TablePrefix: c.prefix})
	if err != nil {
		closeClient()
		return nil, err
	}
	t := &target{kind: "mongo", store: st, migrator: st, comment: "//", ext: "js",
		close: func() { _ = st.Close(); closeClient() }}
	for _, m := range st.Migrations() {
		t.migrations = append(t.migrations, migration{m.Version, m.Name, m.Up, m.Down})
	}
	return t, nil
}

// redactErr returns err's text with the password of rawURL, if any, masked.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	if m := userinfoRE.FindStringSubmatch(rawURL); m != nil && m[2] != "" {
		msg = strings.ReplaceAll(msg, m[2], "xxxxx")
	}
	return msg
}

// mysqlDSN turns mysql://user:pass@host:port/db?params into a
// go-sql-driver DSN.
func mysqlDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", usagef("--url: %v", errors.Unwrap(err))
	}
	cfg := gomysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = u.Hostname() + ":3306"
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return "", usagef("--url %q names no database (mysql://user@host:3306/db)", redact(raw))
	}
	dsn := cfg.FormatDSN()
	if u.RawQuery != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + u.RawQuery
	}
	return dsn, nil
}
