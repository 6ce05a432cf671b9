package testbackend

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQLDefaultDSN is the CI machine's server (MariaDB, root, no password).
const MySQLDefaultDSN = "root@tcp(127.0.0.1:3306)/test"

// MySQLDSN returns the DSN of the test MySQL/MariaDB: OUTBOXKIT_MYSQL_DSN,
// else the local server on 127.0.0.1:3306 when it answers. When neither
// works t is skipped (or fails when backends are required).
func MySQLDSN(t testing.TB) string {
	t.Helper()
	dsn, why := LookupOrStart("OUTBOXKIT_MYSQL_DSN", MySQLDefaultDSN, "127.0.0.1:3306", MySQLContainer)
	if dsn == "" {
		Unavailable(t, "MySQL", why)
	}
	return dsn
}

// MySQLDatabase is one test's isolated database on the test server.
type MySQLDatabase struct {
	// DB is connected to Name; it is closed when the test ends.
	DB *sql.DB
	// Name is a fresh database, created empty and dropped when the test
	// ends, so tests run in parallel.
	Name string
	// DSN connects to Name, for extra connections.
	DSN string
}

// MySQL returns a pool on a fresh database of the test MySQL/MariaDB,
// unique to t (CREATE DATABASE outboxkit_t_<random>). maxConns caps the
// pool (0 means 8). The database is dropped and the pool closed when t
// ends.
func MySQL(t testing.TB, maxConns int) MySQLDatabase {
	t.Helper()
	dsn := MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("testbackend: OUTBOXKIT_MYSQL_DSN: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("testbackend: open MySQL: %v", err)
	}
	defer admin.Close()
	if err := admin.PingContext(ctx); err != nil {
		Unavailable(t, "MySQL", "ping: "+err.Error())
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "outboxkit_t_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("testbackend: create database: %v", err)
	}
	dbCfg := cfg.Clone()
	dbCfg.DBName = name
	dbDSN := dbCfg.FormatDSN()
	db, err := sql.Open("mysql", dbDSN)
	if err != nil {
		t.Fatalf("testbackend: open MySQL: %v", err)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() {
		_ = db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := sql.Open("mysql", cfg.FormatDSN()); err == nil {
			_, _ = c.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
			_ = c.Close()
		}
	})
	return MySQLDatabase{DB: db, Name: name, DSN: dbDSN}
}
