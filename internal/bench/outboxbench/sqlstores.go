package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql" // the MySQL driver for store/mysql

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mysql"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// sqlStore is store/mysql or store/sqlite: what the drain needs of them.
type sqlStore interface {
	outbox.Store
	outbox.Enqueuer[*sql.Tx]
	Migrate(ctx context.Context) error
	MigrateDown(ctx context.Context) error
	Close() error
}

// sqlBackend opens stores on one fresh set of tables (a MySQL table prefix
// or a SQLite file) and removes them.
type sqlBackend struct {
	name string
	open func(ctx context.Context) (sqlStore, error)
	drop func()
}

func mysqlDSN() string {
	if d := os.Getenv("OUTBOXKIT_MYSQL_DSN"); d != "" {
		return d
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

func newSQLBackend(kind string) (*sqlBackend, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	switch kind {
	case "mysql":
		prefix := "bench_" + tag + "_"
		dsn := mysqlDSN()
		open := func(ctx context.Context) (sqlStore, error) {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				return nil, err
			}
			db.SetMaxOpenConns(8)
			s, err := mysql.New(db, mysql.Options{TablePrefix: prefix})
			if err != nil {
				_ = db.Close()
				return nil, err
			}
			return closingDB{s, db}, nil
		}
		return &sqlBackend{name: "store/mysql", open: open, drop: func() {
			if s, err := open(context.Background()); err == nil {
				_ = s.MigrateDown(context.Background())
				_ = s.Close()
			}
		}}, nil
	case "sqlite":
		dir, err := os.MkdirTemp("", "outboxbench-sqlite")
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "outbox.db")
		return &sqlBackend{name: "store/sqlite", open: func(ctx context.Context) (sqlStore, error) {
			return sqlite.Open(ctx, path, sqlite.Options{})
		}, drop: func() { _ = os.RemoveAll(dir) }}, nil
	}
	return nil, fmt.Errorf("unknown store %q", kind)
}

// closingDB closes the database a mysql.Store was given.
type closingDB struct {
	*mysql.Store
	db *sql.DB
}

func (c closingDB) Close() error { return errors.Join(c.Store.Close(), c.db.Close()) }

// benchDrainSQL is the drain of benchDrain on store/mysql or store/sqlite:
// the same backlog (enqueued in batches of 1,000), procs processors, each
// with a store (and database handle) of its own, into the FIFO-checking
// publisher.
func benchDrainSQL(ctx context.Context, c config, kind string, procs int) (float64, string, error) {
	b, err := newSQLBackend(kind)
	if err != nil {
		return 0, "", err
	}
	defer b.drop()
	s, err := b.open(ctx)
	if err != nil {
		return 0, "", err
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		return 0, "", err
	}
	ob := outbox.New[*sql.Tx](s, outbox.Options{})
	for start := 0; start < c.drainN; start += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for i := start; i < min(start+1000, c.drainN); i++ {
			g := fmt.Sprintf("group-%04d", i%c.drainGroups)
			msgs = append(msgs, outbox.Message{Topic: "bench", Group: g, Payload: payload(g, i/c.drainGroups)})
		}
		if _, err := ob.Enqueue(ctx, msgs...); err != nil {
			return 0, "", err
		}
	}
	pub := newFIFO()
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, procs)
	var stores []sqlStore
	defer func() {
		for _, ps := range stores {
			_ = ps.Close()
		}
	}()
	start := time.Now()
	for i := range procs {
		ps, err := b.open(ctx)
		if err != nil {
			cancel()
			wg.Wait()
			return 0, "", err
		}
		stores = append(stores, ps)
		p, err := outbox.NewProcessor(ps, pub, outbox.Config{ID: fmt.Sprintf("bench-%d", i), Topics: []string{"bench"},
			PollBatchSize: c.claimBatch, BufferSize: 2 * c.claimBatch, MaxConcurrentGroups: 10, PollInterval: 100 * time.Millisecond})
		if err != nil {
			cancel()
			wg.Wait()
			return 0, "", err
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.Run(rctx) }()
	}
	for pub.n.Load() < int64(c.drainN) {
		time.Sleep(5 * time.Millisecond)
	}
	// As for PostgreSQL: the drain ends when every message is recorded as
	// sent.
	if err := untilRecorded(func() (bool, error) {
		cnt, err := s.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
		return cnt[outbox.StatusPending]+cnt[outbox.StatusProcessing] > 0, err
	}); err != nil {
		cancel()
		wg.Wait()
		return 0, "", err
	}
	elapsed := time.Since(start)
	cancel()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, "", err
	}
	cnt, err := s.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
	if err != nil {
		return 0, "", err
	}
	return float64(c.drainN) / elapsed.Seconds(), drainNote(pub, cnt, c.drainN, ""), nil
}

// drainNote says whether FIFO held, how many were published twice, and
// whether every message ended SENT.
func drainNote(pub *fifoPublisher, cnt map[outbox.Status]int64, n int, extra string) string {
	fifo := "yes"
	if pub.violated.Load() > 0 {
		fifo = fmt.Sprintf("NO (%d out of order)", pub.violated.Load())
	}
	if cnt[outbox.StatusSent] != int64(n) {
		fifo += fmt.Sprintf("; %d SENT of %d", cnt[outbox.StatusSent], n)
	}
	return fmt.Sprintf("FIFO held: %s, duplicates: %d%s", fifo, pub.dup.Load(), extra)
}
