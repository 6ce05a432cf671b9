package whatsapp

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/outboxkit/outboxkit/internal/testbackend"
)

func randSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stateBackends are the State implementations the contract runs against.
var stateBackends = []struct {
	name string
	new  func(t *testing.T, opts QuotaOptions) State
}{
	{"memory", func(_ *testing.T, o QuotaOptions) State { return NewMemoryState(o) }},
	{"redis", newRedisTestState},
	{"sqlite", newSQLiteTestState},
	{"postgres", newPostgresTestState},
	{"mysql", newMySQLTestState},
}

func newRedisTestState(t *testing.T, o QuotaOptions) State {
	c, prefix := testbackend.Redis(t)
	return NewRedisState(c, RedisOptions{Prefix: prefix, QuotaOptions: o})
}

func newSQLiteTestState(t *testing.T, o QuotaOptions) State {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "wa.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return migrated(t, db, SQLOptions{Dialect: DialectSQLite, QuotaOptions: o})
}

func newPostgresTestState(t *testing.T, o QuotaOptions) State {
	dsn, why := testbackend.Lookup("OUTBOXKIT_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "127.0.0.1:5432")
	if dsn == "" {
		testbackend.Unavailable(t, "PostgreSQL", why)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := "wa_test_" + randSuffix()
	if _, err := db.Exec(`CREATE SCHEMA ` + schema); err != nil {
		_ = db.Close()
		testbackend.Unavailable(t, "PostgreSQL", err.Error())
	}
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		_ = db.Close()
	})
	return migrated(t, db, SQLOptions{Dialect: DialectPostgres, TablePrefix: schema + ".wa_", QuotaOptions: o})
}

func newMySQLTestState(t *testing.T, o QuotaOptions) State {
	dsn, why := testbackend.Lookup("OUTBOXKIT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test", "127.0.0.1:3306")
	if dsn == "" {
		testbackend.Unavailable(t, "MySQL", why)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		_ = db.Close()
		testbackend.Unavailable(t, "MySQL", err.Error())
	}
	prefix := "wa_" + randSuffix() + "_"
	t.Cleanup(func() {
		for _, tb := range []string{"session_window", "quota", "inbound_seen"} {
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + prefix + tb)
		}
		_ = db.Close()
	})
	return migrated(t, db, SQLOptions{Dialect: DialectMySQL, TablePrefix: prefix, QuotaOptions: o})
}

func migrated(t *testing.T, db *sql.DB, opts SQLOptions) *SQLState {
	t.Helper()
	s, err := NewSQLState(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	return s
}

func TestStateContract(t *testing.T) {
	t.Parallel()
	for _, b := range stateBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			t.Run("windows", func(t *testing.T) { t.Parallel(); testWindows(t, b.new(t, QuotaOptions{})) })
			t.Run("quota", func(t *testing.T) {
				t.Parallel()
				testQuota(t, b.new(t, QuotaOptions{DefaultLimit: 50, Window: time.Hour}))
			})
			t.Run("quota exact under 100 concurrent senders", func(t *testing.T) {
				t.Parallel()
				testQuotaConcurrent(t, b.new(t, QuotaOptions{DefaultLimit: 37}))
			})
			t.Run("dedup", func(t *testing.T) { t.Parallel(); testDedup(t, b.new(t, QuotaOptions{})) })
		})
	}
}

func testWindows(t *testing.T, s State) {
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	if _, ok, err := s.WindowGet(ctx, "org-1", testRecipient); err != nil || ok {
		t.Fatalf("no window yet: ok=%v err=%v", ok, err)
	}
	if err := s.WindowTouch(ctx, "org-1", testRecipient, t0); err != nil {
		t.Fatal(err)
	}
	w, ok, err := s.WindowGet(ctx, "org-1", testRecipient)
	if err != nil || !ok {
		t.Fatalf("window: ok=%v err=%v", ok, err)
	}
	if !w.LastInboundAt.Equal(t0) || !w.ExpiresAt.Equal(t0.Add(SessionWindow)) {
		t.Fatalf("window = %+v, want last inbound %v", w, t0)
	}
	if !w.Open(t0.Add(23*time.Hour+59*time.Minute)) || w.Open(t0.Add(24*time.Hour)) {
		t.Fatal("the window must be open for exactly 24 hours")
	}
	// a late, older webhook does not shorten it; a newer one refreshes it
	if err := s.WindowTouch(ctx, "org-1", testRecipient, t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if w, _, _ := s.WindowGet(ctx, "org-1", testRecipient); !w.LastInboundAt.Equal(t0) {
		t.Fatalf("an older inbound moved the window back: %+v", w)
	}
	t1 := t0.Add(time.Minute)
	if err := s.WindowTouch(ctx, "org-1", testRecipient, t1); err != nil {
		t.Fatal(err)
	}
	if w, _, _ := s.WindowGet(ctx, "org-1", testRecipient); !w.LastInboundAt.Equal(t1) {
		t.Fatalf("a newer inbound did not refresh: %+v", w)
	}
	// tenants are separate
	if _, ok, _ := s.WindowGet(ctx, "org-2", testRecipient); ok {
		t.Fatal("org-1's window is visible to org-2")
	}
	// cleanup deletes expired windows only
	if err := s.WindowTouch(ctx, "org-2", "+33612345678", t0.Add(-23*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WindowCleanup(ctx, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.WindowGet(ctx, "org-1", testRecipient); !ok {
		t.Fatal("cleanup removed an open window")
	}
	if _, isRedis := s.(*RedisState); !isRedis {
		if _, ok, _ := s.WindowGet(ctx, "org-2", "+33612345678"); ok {
			t.Fatal("cleanup kept an expired window")
		}
	}
}

func testQuota(t *testing.T, s State) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	st, err := s.QuotaGet(ctx, "org-1", now)
	if err != nil || st.Sent != 0 || st.Limit != 50 || st.Remaining != 50 || st.Throttled {
		t.Fatalf("fresh status = %+v, %v", st, err)
	}
	for i := 1; i <= 50; i++ {
		st, ok, err := s.QuotaConsume(ctx, "org-1", now.Add(time.Duration(i)*time.Second))
		if err != nil || !ok || st.Sent != int64(i) {
			t.Fatalf("consume %d: %+v ok=%v err=%v", i, st, ok, err)
		}
	}
	st, ok, err := s.QuotaConsume(ctx, "org-1", now.Add(time.Minute))
	if err != nil || ok || st.Remaining != 0 || st.Sent != 50 {
		t.Fatalf("over the limit: %+v ok=%v err=%v", st, ok, err)
	}
	if !st.ResetAt.Equal(now.Add(time.Second).Add(time.Hour)) {
		t.Fatalf("ResetAt = %v, want %v (window start + window)", st.ResetAt, now.Add(time.Second).Add(time.Hour))
	}
	// another tenant is separate
	if _, ok, _ := s.QuotaConsume(ctx, "org-2", now); !ok {
		t.Fatal("org-2 refused because of org-1")
	}
	// a per-tenant limit
	if err := s.QuotaSetLimit(ctx, "org-1", 51); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.QuotaConsume(ctx, "org-1", now.Add(time.Minute)); !ok {
		t.Fatal("a raised limit did not allow one more")
	}
	if _, ok, _ := s.QuotaConsume(ctx, "org-1", now.Add(time.Minute)); ok {
		t.Fatal("the raised limit allowed two more")
	}
	if err := s.QuotaSetLimit(ctx, "org-1", 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.QuotaGet(ctx, "org-1", now.Add(time.Minute)); st.Limit != 50 {
		t.Fatalf("limit 0 must restore the default: %+v", st)
	}
	// the window resets
	later := now.Add(time.Second + time.Hour)
	st, ok, err = s.QuotaConsume(ctx, "org-1", later)
	if err != nil || !ok || st.Sent != 1 || !st.ResetAt.Equal(later.Add(time.Hour)) {
		t.Fatalf("after the window: %+v ok=%v err=%v", st, ok, err)
	}
	// throttle: refused until it ends; an earlier throttle does not shorten it
	until := later.Add(10 * time.Minute)
	if err := s.QuotaThrottle(ctx, "org-1", until, later); err != nil {
		t.Fatal(err)
	}
	if err := s.QuotaThrottle(ctx, "org-1", later.Add(time.Minute), later); err != nil {
		t.Fatal(err)
	}
	st, ok, err = s.QuotaConsume(ctx, "org-1", later.Add(5*time.Minute))
	if err != nil || ok || !st.Throttled || !st.ThrottledUntil.Equal(until) || st.Sent != 1 {
		t.Fatalf("throttled: %+v ok=%v err=%v", st, ok, err)
	}
	if _, ok, _ := s.QuotaConsume(ctx, "org-1", until); !ok {
		t.Fatal("still refused when the throttle ended")
	}
	// throttle on a tenant never seen before
	if err := s.QuotaThrottle(ctx, "org-3", until, later); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.QuotaGet(ctx, "org-3", later); !st.Throttled {
		t.Fatalf("org-3: %+v", st)
	}
}

func testQuotaConcurrent(t *testing.T, s State) {
	ctx := context.Background()
	now := time.Now().UTC()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := s.QuotaConsume(ctx, "org-c", now)
			if err != nil {
				errs <- err
				return
			}
			if ok {
				allowed.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := allowed.Load(); n != 37 {
		t.Fatalf("%d of 100 concurrent senders allowed, want exactly 37", n)
	}
	if st, _ := s.QuotaGet(ctx, "org-c", now); st.Sent != 37 || st.Remaining != 0 {
		t.Fatalf("status = %+v", st)
	}
}

func testDedup(t *testing.T, s State) {
	ctx := context.Background()
	now := time.Now()
	for i, want := range []bool{true, false, false} {
		if got, err := s.InboundClaim(ctx, "org-1", "wamid.IN1", now); err != nil || got != want {
			t.Fatalf("claim %d = %v, %v; want %v", i, got, err, want)
		}
	}
	if got, _ := s.InboundClaim(ctx, "org-2", "wamid.IN1", now); !got {
		t.Fatal("the same id in another tenant is a different message")
	}
	if err := s.InboundRelease(ctx, "org-1", "wamid.IN1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.InboundClaim(ctx, "org-1", "wamid.IN1", now); !got {
		t.Fatal("a released id was not claimable again")
	}
}

// tcpProxy forwards connections to target until closed: closing it is how
// a test "stops" the shared Redis for one client only.
type tcpProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	t.Cleanup(p.Close)
	return p
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func TestFallbackWhenRedisStops(t *testing.T) {
	t.Parallel()
	addr := testbackend.RedisAddr(t)
	_, prefix := testbackend.Redis(t) // registers cleanup of the prefix
	proxy := newTCPProxy(t, addr)
	rc := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = rc.Close() })
	primary := NewRedisState(rc, RedisOptions{Prefix: prefix, QuotaOptions: QuotaOptions{DefaultLimit: 3}})
	secondary := newSQLiteTestState(t, QuotaOptions{DefaultLimit: 3})
	f := &Fallback{Primary: primary, Secondary: secondary}
	ctx := context.Background()
	now := time.Now()

	if _, ok, err := f.QuotaConsume(ctx, "org-1", now); err != nil || !ok {
		t.Fatalf("through Redis: ok=%v err=%v", ok, err)
	}
	if st, err := primary.QuotaGet(ctx, "org-1", now); err != nil || st.Sent != 1 {
		t.Fatalf("Redis did not count: %+v %v", st, err)
	}
	proxy.Close() // Redis is now unreachable for this client
	for i := 0; i < 3; i++ {
		_, ok, err := f.QuotaConsume(ctx, "org-1", now)
		if err != nil {
			t.Fatalf("fallback consume %d: %v", i, err)
		}
		if ok != (i < 3) {
			t.Fatalf("fallback consume %d: ok=%v", i, ok)
		}
	}
	if _, ok, _ := f.QuotaConsume(ctx, "org-1", now); ok {
		t.Fatal("the SQL fallback does not enforce the limit")
	}
	if st, err := secondary.QuotaGet(ctx, "org-1", now); err != nil || st.Sent != 3 {
		t.Fatalf("SQL fallback status = %+v, %v", st, err)
	}
	if err := f.WindowTouch(ctx, "org-1", testRecipient, now); err != nil {
		t.Fatalf("window through the fallback: %v", err)
	}
	if _, ok, err := f.WindowGet(ctx, "org-1", testRecipient); err != nil || !ok {
		t.Fatalf("window through the fallback: ok=%v err=%v", ok, err)
	}
	if first, err := f.InboundClaim(ctx, "org-1", "wamid.X", now); err != nil || !first {
		t.Fatalf("dedup through the fallback: %v %v", first, err)
	}
}

func TestFallbackWhenRedisNeverAnswers(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	rc := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1, DialTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = rc.Close() })
	f := &Fallback{Primary: NewRedisState(rc, RedisOptions{}), Secondary: NewMemoryState(QuotaOptions{DefaultLimit: 1})}
	ctx := context.Background()
	if _, ok, err := f.QuotaConsume(ctx, "org-1", time.Now()); err != nil || !ok {
		t.Fatalf("ok=%v err=%v", ok, err)
	}
	if _, ok, err := f.QuotaConsume(ctx, "org-1", time.Now()); err != nil || ok {
		t.Fatalf("second: ok=%v err=%v", ok, err)
	}
}

func TestNewSQLStateValidates(t *testing.T) {
	t.Parallel()
	db, _ := sql.Open("sqlite", filepath.Join(t.TempDir(), "x.db"))
	t.Cleanup(func() { _ = db.Close() })
	if _, err := NewSQLState(db, SQLOptions{}); err == nil {
		t.Fatal("no dialect accepted")
	}
	if _, err := NewSQLState(db, SQLOptions{Dialect: DialectSQLite, TablePrefix: "x; DROP TABLE y; --"}); err == nil {
		t.Fatal("an injected prefix accepted")
	}
}
