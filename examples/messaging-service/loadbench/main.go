// Command loadbench measures the messaging service's create endpoint
// (POST /api/v1/outbound/messages over HTTP on loopback): accepted
// messages per second and latency percentiles, with a fixed number of
// concurrent clients, bounded in time and count. In the same run it
// measures the outbox store's own single-message enqueue rate
// (outbox.Enqueue, one message per transaction, same concurrency), the
// ceiling the endpoint is compared with. The processor is not running: the
// numbers are the API's.
//
//	go run ./examples/messaging-service/loadbench -store sqlite
//	go run ./examples/messaging-service/loadbench -store postgres -dsn postgres://postgres@127.0.0.1:5432/postgres
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
	"github.com/outboxkit/outboxkit/store/sqlite"
	"github.com/outboxkit/outboxkit/whatsapp"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(1)
	}
}

const apiKey = "bench-key-0123456789abcdef"

func run() error {
	store := flag.String("store", "sqlite", "sqlite or postgres")
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL DSN (a fresh schema is created and dropped)")
	dur := flag.Duration("duration", 10*time.Second, "length of each phase")
	maxN := flag.Int("max", 50000, "most requests of each phase")
	conc := flag.Int("concurrency", 32, "concurrent clients")
	conns := flag.Int("conns", 16, "database connections")
	flag.Parse()
	ctx := context.Background()

	var b [4]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	cfg := service.Config{Store: *store, MaxConns: *conns, GraphBaseURL: "http://127.0.0.1:1"}
	o := service.Org{ID: "org-bench", APIKey: apiKey, WhatsApp: whatsapp.Credentials{PhoneNumberID: "1", AccessToken: "t", AppSecret: "s"}}
	cfg.Orgs = []service.Org{o}
	var ownEnqueue func(ctx context.Context, i int) error
	switch *store {
	case "sqlite":
		dir, err := os.MkdirTemp("", "loadbench")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.DSN = filepath.Join(dir, "bench.db")
		// The store's own rate, on a database of its own.
		st, err := sqlite.Open(ctx, filepath.Join(dir, "store.db"), sqlite.Options{})
		if err != nil {
			return err
		}
		defer st.Close()
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		ob := outbox.New[any](enqueuerOf(st), outbox.Options{})
		ownEnqueue = func(ctx context.Context, i int) error { _, err := ob.Enqueue(ctx, benchMessage(i)); return err }
	case "postgres":
		schema := "msgsvc_bench_" + tag
		cfg.DSN, cfg.PostgresSchema = *dsn, schema
		pool, err := pgxpool.New(ctx, *dsn)
		if err != nil {
			return err
		}
		defer func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema + "_store"}.Sanitize()+" CASCADE")
			pool.Close()
		}()
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
		pc, _ := pgxpool.ParseConfig(*dsn)
		pc.MaxConns = int32(*conns)
		spool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return err
		}
		defer spool.Close()
		st, err := postgres.New(spool, postgres.Options{Schema: schema + "_store"})
		if err != nil {
			return err
		}
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		ob := outbox.New[pgx.Tx](st, outbox.Options{})
		ownEnqueue = func(ctx context.Context, i int) error { _, err := ob.Enqueue(ctx, benchMessage(i)); return err }
	default:
		return fmt.Errorf("-store must be sqlite or postgres")
	}

	svc, err := service.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	const dossiers = 100
	for d := int64(1); d <= dossiers; d++ {
		if err := svc.SeedConsent(ctx, o.ID, d, "WHATSAPP"); err != nil {
			return err
		}
	}
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conc, MaxConnsPerHost: *conc}}

	// Warm up (connections, statement caches).
	_ = load(ctx, *conc, time.Second, 2000, func(ctx context.Context, i int) error { return post(ctx, client, ts.URL, "warm-"+tag, i) })
	_ = load(ctx, *conc, time.Second, 2000, func(ctx context.Context, i int) error { return ownEnqueue(ctx, -1-i) })

	own := load(ctx, *conc, *dur, *maxN, ownEnqueue)
	api := load(ctx, *conc, *dur, *maxN, func(ctx context.Context, i int) error { return post(ctx, client, ts.URL, tag, i) })
	fmt.Printf("store=%s concurrency=%d conns=%d duration=%s\n\n", *store, *conc, *conns, *dur)
	fmt.Println("| what | accepted | errors | msg/s | p50 | p99 |")
	fmt.Println("|---|---|---|---|---|---|")
	own.print("store enqueue (outbox.Enqueue, 1 msg/tx)")
	api.print("POST /api/v1/outbound/messages")
	fmt.Printf("\nendpoint / store enqueue rate: %.0f%%\n", 100*api.rate()/own.rate())
	return nil
}

func enqueuerOf(st *sqlite.Store) outbox.Enqueuer[any] { return anyEnqueuer{st} }

// anyEnqueuer lets the bench use Enqueue (the store's own transaction)
// without naming *sql.Tx.
type anyEnqueuer struct{ st *sqlite.Store }

func (a anyEnqueuer) MessageEnqueue(ctx context.Context, p outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return a.st.MessageEnqueue(ctx, p)
}

func (a anyEnqueuer) MessageEnqueueTx(context.Context, any, outbox.MessageEnqueueParams) ([]outbox.Enqueued, error) {
	return nil, fmt.Errorf("unused")
}

func benchMessage(i int) outbox.Message {
	return outbox.Message{Tenant: "org-bench", Topic: service.Topic,
		Payload: []byte(`{"to":"+33600000000","templateCode":"order_confirmation","payloadJson":{"language":"en"}}`),
		Headers: map[string]string{"dossier-id": fmt.Sprint(i%100 + 1), "channel": "WHATSAPP"}, MaxAttempts: 5}
}

func post(ctx context.Context, c *http.Client, base, tag string, i int) error {
	body := fmt.Sprintf(`{"dossierId":%d,"channel":"WHATSAPP","to":"+3360000%04d","templateCode":"order_confirmation","payloadJson":{"language":"en","components":[{"type":"body","parameters":[{"type":"text","text":"John"}]}]}}`, i%100+1, i%10000)
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/api/v1/outbound/messages", bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("X-Org-Id", "org-bench")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", tag, i))
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", res.StatusCode)
	}
	return nil
}

type result struct {
	ok, errs int64
	elapsed  time.Duration
	lat      []time.Duration
}

func (r result) rate() float64 { return float64(r.ok) / r.elapsed.Seconds() }

func (r result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, int(float64(len(r.lat))*p))]
}

func (r result) print(what string) {
	fmt.Printf("| %s | %d | %d | %.0f | %s | %s |\n", what, r.ok, r.errs, r.rate(),
		r.pct(0.50).Round(10*time.Microsecond), r.pct(0.99).Round(10*time.Microsecond))
}

// load runs fn from conc goroutines until d passed or max calls started.
func load(ctx context.Context, conc int, d time.Duration, maxN int, fn func(context.Context, int) error) result {
	var next, ok, errs atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				i := int(next.Add(1))
				if i > maxN {
					break
				}
				t0 := time.Now()
				if err := fn(ctx, i); err != nil {
					if errs.Add(1) == 1 {
						fmt.Fprintln(os.Stderr, "first error:", err)
					}
					continue
				}
				mine = append(mine, time.Since(t0))
				ok.Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return result{ok: ok.Load(), errs: errs.Load(), elapsed: time.Since(start), lat: lat}
}
