package redisstate_test

import (
	"context"
	"database/sql"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/whatsapp"
	"github.com/outboxkit/outboxkit/whatsapp/internal/statetest"
	"github.com/outboxkit/outboxkit/whatsapp/redisstate"
)

// TestStateContract runs the whatsapp.State contract on Redis (keys under
// a prefix of this run, deleted at the end). Redis expires windows by
// itself, so WindowCleanup is not checked.
func TestStateContract(t *testing.T) {
	t.Parallel()
	statetest.Run(t, func(t *testing.T, o whatsapp.QuotaOptions) whatsapp.State {
		c, prefix := testbackend.Redis(t)
		return redisstate.New(c, redisstate.Options{Prefix: prefix, QuotaOptions: o})
	}, statetest.Features{ExpiresWindows: true})
}

// newSQLiteState is the fallback of the tests below: an SQLState in a
// SQLite file of the test.
func newSQLiteState(t *testing.T, o whatsapp.QuotaOptions) *whatsapp.SQLState {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "wa.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := whatsapp.NewSQLState(db, whatsapp.SQLOptions{Dialect: whatsapp.DialectSQLite, QuotaOptions: o})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
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
	primary := redisstate.New(rc, redisstate.Options{Prefix: prefix, QuotaOptions: whatsapp.QuotaOptions{DefaultLimit: 3}})
	secondary := newSQLiteState(t, whatsapp.QuotaOptions{DefaultLimit: 3})
	f := &whatsapp.Fallback{Primary: primary, Secondary: secondary}
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
	if err := f.WindowTouch(ctx, "org-1", "+16505551234", now); err != nil {
		t.Fatalf("window through the fallback: %v", err)
	}
	if _, ok, err := f.WindowGet(ctx, "org-1", "+16505551234"); err != nil || !ok {
		t.Fatalf("window through the fallback: ok=%v err=%v", ok, err)
	}
	if first, err := f.InboundClaim(ctx, "org-1", "wamid.X", now); err != nil || !first {
		t.Fatalf("dedup through the fallback: %v %v", first, err)
	}
}

func TestFallbackWhenRedisNeverAnswers(t *testing.T) {
	t.Parallel()
	// A server that accepts connections and never answers (a hung Redis),
	// kept listening for the whole test so no other process can take its
	// port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	rc := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = rc.Close() })
	f := &whatsapp.Fallback{Primary: redisstate.New(rc, redisstate.Options{}), Secondary: whatsapp.NewMemoryState(whatsapp.QuotaOptions{DefaultLimit: 1})}
	ctx := context.Background()
	if _, ok, err := f.QuotaConsume(ctx, "org-1", time.Now()); err != nil || !ok {
		t.Fatalf("ok=%v err=%v", ok, err)
	}
	if _, ok, err := f.QuotaConsume(ctx, "org-1", time.Now()); err != nil || ok {
		t.Fatalf("second: ok=%v err=%v", ok, err)
	}
}
