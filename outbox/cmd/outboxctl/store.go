package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
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
}

func (c *conn) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", os.Getenv("OUTBOXCTL_URL"), "store URL: postgres://…, mysql://…, sqlite:///path (default $OUTBOXCTL_URL)")
	fs.StringVar(&c.prefix, "prefix", "", "table prefix (default the store's, outbox_)")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema (default public)")
}

// parse parses args into fs, mapping -h and flag errors to errHelp and
// errFlags (the flag package printed the message).
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stderr)
		fs.PrintDefaults()
		return errHelp
	case err != nil:
		return fmt.Errorf("%w: %v", errFlags, err)
	}
	return nil
}

// migrator is what every SQL store offers for its schema.
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
	kind       string // postgres, mysql, sqlite
	store      outbox.Store
	migrator   migrator
	migrations []migration
	// preamble is SQL that `migrate sql` prints first (PostgreSQL's
	// CREATE SCHEMA, which Migrate runs itself).
	preamble string
	close    func()
}

// admin returns the store's outbox.Admin.
func (t *target) admin() (outbox.Admin, error) {
	a, ok := t.store.(outbox.Admin)
	if !ok {
		return nil, outbox.ErrNotAdmin
	}
	return a, nil
}

// redact removes the password of a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// open connects to the store c.url names.
func (c *conn) open(ctx context.Context) (*target, error) {
	if c.url == "" {
		return nil, usagef("--url (or OUTBOXCTL_URL) is required")
	}
	scheme, rest, ok := strings.Cut(c.url, ":")
	if !ok {
		return nil, usagef("--url %q has no scheme (postgres://, mysql://, sqlite:)", redact(c.url))
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
		st, err := sqlite.Open(ctx, path, sqlite.Options{TablePrefix: c.prefix})
		if err != nil {
			return nil, err
		}
		t := &target{kind: "sqlite", store: st, migrator: st, close: func() { st.Close() }}
		for _, m := range st.Migrations() {
			t.migrations = append(t.migrations, migration{m.Version, m.Name, m.Up, m.Down})
		}
		return t, nil
	}
	return nil, usagef("--url scheme %q is not supported (postgres, mysql, sqlite)", scheme)
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
