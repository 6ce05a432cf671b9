// Command postgres-bench measures store/postgres on this machine and prints
// one table: enqueue throughput, drain throughput with FIFO checked,
// enqueue-to-publish latency at a steady rate, peak RSS while draining a
// large backlog, and pgbench's ceilings for the equivalent statements so
// every figure can be read as a fraction of what PostgreSQL itself does
// here.
//
//	go run ./examples/postgres-bench                 # full run (about 5 minutes)
//	go run ./examples/postgres-bench -quick          # smaller sizes (about 1 minute)
//	go run ./examples/postgres-bench -dsn postgres://user@host/db
//
// It works in fresh schemas (bench_*) that it drops at the end. pgbench must
// be on PATH for the ceilings (Debian: postgresql-client).
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

type config struct {
	dsn          string
	quick        bool
	enqueueFor   time.Duration
	drainN       int
	drainGroups  int
	latencyRate  int
	latencyFor   time.Duration
	rssN         int
	pgbench      bool
	pgbenchFor   time.Duration
	clients      int
	claimBatch   int
	processorCfg outbox.Config
}

func main() {
	var c config
	defDSN := os.Getenv("OUTBOXKIT_POSTGRES_DSN")
	if defDSN == "" {
		defDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	flag.StringVar(&c.dsn, "dsn", defDSN, "PostgreSQL connection string (default $OUTBOXKIT_POSTGRES_DSN or the local server)")
	flag.BoolVar(&c.quick, "quick", false, "smaller sizes, for a smoke run")
	flag.BoolVar(&c.pgbench, "pgbench", true, "measure pgbench ceilings (needs pgbench on PATH)")
	mode := flag.String("mode", "", "internal: child process modes")
	schema := flag.String("schema", "", "internal: schema for child modes")
	flag.BoolVar(&noNotify, "no-notify", false, "stores run with Options.DisableNotify (polling only)")
	only := flag.String("only", "", "comma-separated subset: enqueue,drain,latency,rss,pgbench")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("postgres-bench: ")

	c.enqueueFor, c.drainN, c.drainGroups = 10*time.Second, 100_000, 1000
	c.latencyRate, c.latencyFor, c.rssN = 500, 20*time.Second, 1_000_000
	c.pgbenchFor, c.clients, c.claimBatch = 10*time.Second, 8, 500
	if c.quick {
		c.enqueueFor, c.drainN, c.latencyFor, c.rssN, c.pgbenchFor = 3*time.Second, 20_000, 5*time.Second, 100_000, 3*time.Second
	}

	ctx := context.Background()
	if *mode == "drain-rss" {
		if err := childDrain(ctx, c, *schema); err != nil {
			log.Fatal(err)
		}
		return
	}
	want := func(s string) bool {
		return *only == "" || slices.Contains(strings.Split(*only, ","), s)
	}
	pool, err := newPool(ctx, c.dsn, 20)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	var rows []row
	add := func(r ...row) {
		for _, x := range r {
			log.Printf("%-58s %s", x.name, x.value)
		}
		rows = append(rows, r...)
	}
	if want("pgbench") && c.pgbench {
		r, err := pgbenchCeilings(ctx, c, pool)
		if err != nil {
			log.Printf("pgbench ceilings skipped: %v", err)
		}
		add(r...)
	}
	if want("enqueue") {
		for _, per := range []int{1, 100} {
			r, err := benchEnqueue(ctx, c, pool, per)
			if err != nil {
				log.Fatal(err)
			}
			add(r)
		}
	}
	if want("drain") {
		for _, procs := range []int{1, 4} {
			r, err := benchDrain(ctx, c, pool, procs)
			if err != nil {
				log.Fatal(err)
			}
			add(r...)
		}
	}
	if want("latency") {
		r, err := benchLatency(ctx, c, pool)
		if err != nil {
			log.Fatal(err)
		}
		add(r...)
	}
	if want("rss") {
		r, err := benchRSS(ctx, c, pool)
		if err != nil {
			log.Fatal(err)
		}
		add(r...)
	}
	fmt.Printf("\n## store/postgres on %d cores, PostgreSQL %s, Go %s\n\n", runtime.NumCPU(), version, runtime.Version())
	fmt.Println("| measurement | result |")
	fmt.Println("|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %s |\n", r.name, r.value)
	}
}

type row struct{ name, value string }

var noNotify bool

func newPool(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("dsn: %w", err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "outboxkit-bench"
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// fresh creates a migrated store in a new schema, dropped by the returned
// cleanup.
func fresh(ctx context.Context, pool *pgxpool.Pool, opts postgres.Options) (*postgres.Store, func(), error) {
	opts.DisableNotify = noNotify
	var b [5]byte
	_, _ = rand.Read(b[:])
	opts.Schema = "bench_" + hex.EncodeToString(b[:])
	s, err := postgres.New(pool, opts)
	if err != nil {
		return nil, nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	return s, func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+opts.Schema+" CASCADE") }, nil
}

// payload returns a ~200-byte JSON document.
func payload(group string, n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"group":%q,"n":%d,"type":"order.updated","data":{"customer":"c-%06d","amount_cents":%d,"currency":"EUR","note":"%s"}}`,
		group, n, n%1000000, n*7%100000, strings.Repeat("x", 80)))
}

// bulkEnqueue enqueues n messages over groups groups (message i in group
// i%groups), in batches of 1,000 from 4 goroutines.
func bulkEnqueue(ctx context.Context, s *postgres.Store, n, groups int) error {
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	const batch = 1000
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				start := int(next.Add(batch)) - batch
				if start >= n {
					return
				}
				msgs := make([]outbox.Message, 0, batch)
				for i := start; i < min(start+batch, n); i++ {
					g := fmt.Sprintf("group-%04d", i%groups)
					msgs = append(msgs, outbox.Message{Topic: "bench", Group: g, Payload: payload(g, i/groups)})
				}
				if _, err := ob.Enqueue(ctx, msgs...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Note: bulkEnqueue's batches run concurrently, so positions within a group
// are only ordered by sequence; the FIFO check below uses the sequence.

func benchEnqueue(ctx context.Context, c config, pool *pgxpool.Pool, per int) (row, error) {
	s, cleanup, err := fresh(ctx, pool, postgres.Options{})
	if err != nil {
		return row{}, err
	}
	defer cleanup()
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	var total atomic.Int64
	deadline := time.Now().Add(c.enqueueFor)
	var wg sync.WaitGroup
	errs := make(chan error, c.clients)
	start := time.Now()
	for w := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), 1))
			msgs := make([]outbox.Message, per)
			for i := 0; time.Now().Before(deadline); i++ {
				for j := range msgs {
					g := fmt.Sprintf("group-%04d", rng.IntN(1000))
					msgs[j] = outbox.Message{Topic: "bench", Group: g, Payload: payload(g, i)}
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				if _, err := ob.EnqueueTx(ctx, tx, msgs...); err != nil {
					_ = tx.Rollback(ctx)
					errs <- err
					return
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
				total.Add(int64(per))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return row{}, err
	}
	rate := float64(total.Load()) / elapsed.Seconds()
	return row{fmt.Sprintf("enqueue, %d message(s) per transaction, %d clients", per, c.clients), fmt.Sprintf("%.0f msg/s", rate)}, nil
}

// fifoPublisher is a no-op publisher that checks FIFO per group by sequence
// and counts publications.
type fifoPublisher struct {
	mu       sync.Mutex
	last     map[string]int64
	n        atomic.Int64
	violated atomic.Int64
	dup      atomic.Int64
	seen     map[string]bool
	onPub    func(m *outbox.Message)
}

func newFIFO() *fifoPublisher {
	return &fifoPublisher{last: map[string]int64{}, seen: map[string]bool{}}
}

func (f *fifoPublisher) Publish(_ context.Context, msgs []outbox.Message) []outbox.Result {
	f.mu.Lock()
	for i := range msgs {
		m := &msgs[i]
		if f.seen[m.ID] {
			f.dup.Add(1)
		}
		f.seen[m.ID] = true
		if m.Group != "" {
			k := m.GroupKey()
			if m.Seq <= f.last[k] {
				f.violated.Add(1)
			}
			f.last[k] = m.Seq
		}
		if f.onPub != nil {
			f.onPub(m)
		}
	}
	f.mu.Unlock()
	f.n.Add(int64(len(msgs)))
	return make([]outbox.Result, len(msgs))
}

// runProcessors runs n processors on the store's schema, each with a pool of
// its own (as separate replicas would have), until stop is called.
func runProcessors(ctx context.Context, dsn string, s *postgres.Store, pub outbox.Publisher, n int, cfg outbox.Config) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, n)
	var pools []*pgxpool.Pool
	fail := func(err error) func() error {
		cancel()
		for _, p := range pools {
			p.Close()
		}
		return func() error { return err }
	}
	for i := range n {
		pool, err := newPool(ctx, dsn, 6)
		if err != nil {
			return fail(err)
		}
		pools = append(pools, pool)
		ps, err := postgres.New(pool, postgres.Options{Schema: s.Schema(), DisableNotify: noNotify})
		if err != nil {
			return fail(err)
		}
		c := cfg
		c.ID = fmt.Sprintf("bench-%d", i)
		p, err := outbox.NewProcessor(ps, pub, c)
		if err != nil {
			return fail(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.Run(ctx) }()
	}
	return func() error {
		cancel()
		wg.Wait()
		for _, p := range pools {
			p.Close()
		}
		return errors.Join(errs...)
	}
}

func benchDrain(ctx context.Context, c config, pool *pgxpool.Pool, procs int) ([]row, error) {
	s, cleanup, err := fresh(ctx, pool, postgres.Options{})
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := bulkEnqueue(ctx, s, c.drainN, c.drainGroups); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+s.MessagesTable()); err != nil {
		return nil, err
	}
	pub := newFIFO()
	start := time.Now()
	stop := runProcessors(ctx, c.dsn, s, pub, procs, outbox.Config{PollBatchSize: c.claimBatch, BufferSize: 2 * c.claimBatch, MaxConcurrentGroups: 10, PollInterval: 100 * time.Millisecond})
	for pub.n.Load() < int64(c.drainN) {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		return nil, err
	}
	cnt, err := s.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
	if err != nil {
		return nil, err
	}
	fifo := "yes"
	if pub.violated.Load() > 0 {
		fifo = fmt.Sprintf("NO (%d out of order)", pub.violated.Load())
	}
	if cnt[outbox.StatusSent] != int64(c.drainN) {
		fifo += fmt.Sprintf("; %d SENT of %d", cnt[outbox.StatusSent], c.drainN)
	}
	return []row{{
		fmt.Sprintf("drain %d messages (%d groups), %d processor(s)", c.drainN, c.drainGroups, procs),
		fmt.Sprintf("%.0f msg/s, FIFO held: %s, duplicates: %d", float64(c.drainN)/elapsed.Seconds(), fifo, pub.dup.Load()),
	}}, nil
}

func benchLatency(ctx context.Context, c config, pool *pgxpool.Pool) ([]row, error) {
	s, cleanup, err := fresh(ctx, pool, postgres.Options{})
	if err != nil {
		return nil, err
	}
	defer cleanup()
	var mu sync.Mutex
	committed := map[string]time.Time{}
	var lat []time.Duration
	pub := newFIFO()
	pub.onPub = func(m *outbox.Message) {
		now := time.Now()
		mu.Lock()
		if t, ok := committed[m.ID]; ok {
			lat = append(lat, now.Sub(t))
			delete(committed, m.ID)
		} else {
			committed[m.ID] = now // published before the producer recorded its commit: latency ~0
		}
		mu.Unlock()
	}
	stop := runProcessors(ctx, c.dsn, s, pub, 1, outbox.Config{})
	time.Sleep(500 * time.Millisecond) // listener up
	ob := outbox.New[pgx.Tx](s, outbox.Options{})
	total := int(c.latencyFor.Seconds()) * c.latencyRate
	interval := time.Second / time.Duration(c.latencyRate)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	sem := make(chan struct{}, 64)
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			g := fmt.Sprintf("group-%04d", i%1000)
			tx, err := pool.Begin(ctx)
			if err == nil {
				var r []outbox.Enqueued
				r, err = ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "bench", Group: g, Payload: payload(g, i)})
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err == nil {
					now := time.Now()
					mu.Lock()
					if t, ok := committed[r[0].Message.ID]; ok {
						lat = append(lat, max(0, t.Sub(now)))
						delete(committed, r[0].Message.ID)
					} else {
						committed[r[0].Message.ID] = now
					}
					mu.Unlock()
				}
			}
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
	}
	wg.Wait()
	achieved := float64(total) / time.Since(start).Seconds()
	deadline := time.Now().Add(30 * time.Second)
	for pub.n.Load() < int64(total) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		return nil, err
	}
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if os.Getenv("BENCH_DEBUG") != "" {
		for i, l := range lat {
			if l > 50*time.Millisecond {
				log.Printf("slow sample %d: %s", i, l)
			}
		}
	}
	slices.Sort(lat)
	pct := func(p float64) string {
		if len(lat) == 0 {
			return "n/a"
		}
		i := int(math.Ceil(p/100*float64(len(lat)))) - 1
		return fmt.Sprintf("%.1f ms", float64(lat[max(i, 0)])/float64(time.Millisecond))
	}
	return []row{{
		fmt.Sprintf("latency enqueue-commit to publish, %d msg/s for %s (1 processor, defaults)", c.latencyRate, c.latencyFor),
		fmt.Sprintf("p50 %s, p95 %s, p99 %s, max %s (%d samples, %.0f msg/s achieved)", pct(50), pct(95), pct(99), pct(100), len(lat), achieved),
	}}, nil
}

// benchRSS enqueues rssN messages, then drains them in a child process (one
// processor, defaults) that reports its peak RSS.
func benchRSS(ctx context.Context, c config, pool *pgxpool.Pool) ([]row, error) {
	s, cleanup, err := fresh(ctx, pool, postgres.Options{})
	if err != nil {
		return nil, err
	}
	defer cleanup()
	start := time.Now()
	if err := bulkEnqueue(ctx, s, c.rssN, c.drainGroups); err != nil {
		return nil, err
	}
	log.Printf("enqueued %d messages in %s", c.rssN, time.Since(start).Round(time.Millisecond))
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+s.MessagesTable()); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-mode", "drain-rss", "-schema", s.Schema(), "-dsn", c.dsn}
	if c.quick {
		args = append(args, "-quick")
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("child: %w", err)
	}
	return []row{{fmt.Sprintf("peak RSS draining %d messages (1 processor, defaults)", c.rssN), strings.TrimSpace(string(out))}}, nil
}

func childDrain(ctx context.Context, c config, schema string) error {
	pool, err := newPool(ctx, c.dsn, 10)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := postgres.New(pool, postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	f := &countPublisher{} // keeps nothing: the figure is the processor's memory
	start := time.Now()
	stop := runProcessors(ctx, c.dsn, s, f, 1, outbox.Config{})
	for f.n.Load() < int64(c.rssN) {
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		return err
	}
	hwm, err := vmHWM()
	if err != nil {
		return err
	}
	fmt.Printf("%.1f MB (drained at %.0f msg/s)\n", float64(hwm)/1024, float64(c.rssN)/elapsed.Seconds())
	return nil
}

type countPublisher struct{ n atomic.Int64 }

func (p *countPublisher) Publish(_ context.Context, msgs []outbox.Message) []outbox.Result {
	p.n.Add(int64(len(msgs)))
	return make([]outbox.Result, len(msgs))
}

// vmHWM returns the process's peak RSS in KiB (Linux).
func vmHWM() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// pgbenchCeilings runs pgbench on a copy of the outbox schema with the
// statements a store would run without its extras (no advisory lock, no
// notify, no FIFO logic): a single-row insert per transaction, a 100-row
// insert per transaction, and the naive claim (SKIP LOCKED, 100 rows) plus
// the update that marks them sent.
func pgbenchCeilings(ctx context.Context, c config, pool *pgxpool.Pool) ([]row, error) {
	if _, err := exec.LookPath("pgbench"); err != nil {
		return nil, errors.New("pgbench is not on PATH")
	}
	s, cleanup, err := fresh(ctx, pool, postgres.Options{})
	if err != nil {
		return nil, err
	}
	defer cleanup()
	dir, err := os.MkdirTemp("", "outboxkit-pgbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	t := s.MessagesTable()
	cols := `(id, tenant, topic, grp, idempotency_key, status, attempts, max_attempts, next_attempt_at, created_at, updated_at, payload)`
	val := func(id string) string {
		return fmt.Sprintf(`(%s, '', 'bench', 'group-' || (random()*1000)::int, %s, 'PENDING', 0, 0, now(), now(), now(), '%s')`, id, id, payload("group-0001", 1))
	}
	one := fmt.Sprintf("INSERT INTO %s %s VALUES %s;\n", t, cols, val(`md5(random()::text || clock_timestamp()::text)`))
	hundred := fmt.Sprintf("INSERT INTO %s %s SELECT %s FROM generate_series(1, 100) g;\n", t, cols,
		strings.TrimSuffix(strings.TrimPrefix(val(`md5(random()::text || clock_timestamp()::text || g)`), "("), ")"))
	claim := fmt.Sprintf(`BEGIN;
WITH c AS (SELECT id FROM %[1]s WHERE status = 'PENDING' ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE %[1]s m SET status = 'PROCESSING', attempts = m.attempts + 1, claimed_at = now(), claimed_by = 'c' || :client_id, updated_at = now() FROM c WHERE m.id = c.id;
COMMIT;
UPDATE %[1]s SET status = 'SENT', sent_at = now(), updated_at = now(), claimed_at = NULL, claimed_by = NULL WHERE status = 'PROCESSING' AND claimed_by = 'c' || :client_id;
`, t)
	run := func(name, script string, clients int, extra ...string) (float64, error) {
		f := filepath.Join(dir, name+".sql")
		if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
			return 0, err
		}
		args := append([]string{"-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())), "-f", f}, extra...)
		args = append(args, c.dsn)
		out, err := exec.CommandContext(ctx, "pgbench", args...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("pgbench %s: %w: %s", name, err, out)
		}
		m := tpsRE.FindSubmatch(out)
		if m == nil {
			return 0, fmt.Errorf("pgbench %s: no tps in output: %s", name, out)
		}
		return strconv.ParseFloat(string(m[1]), 64)
	}
	secs := strconv.Itoa(int(c.pgbenchFor.Seconds()))
	var rows []row
	tps, err := run("insert1", one, c.clients, "-T", secs)
	if err != nil {
		return rows, err
	}
	rows = append(rows, row{fmt.Sprintf("ceiling: pgbench single-row INSERT per transaction, %d clients", c.clients), fmt.Sprintf("%.0f rows/s", tps)})
	tps, err = run("insert100", hundred, c.clients, "-T", secs)
	if err != nil {
		return rows, err
	}
	rows = append(rows, row{fmt.Sprintf("ceiling: pgbench 100-row INSERT per transaction, %d clients", c.clients), fmt.Sprintf("%.0f rows/s", tps*100)})
	// The claim ceiling drains a backlog of the same shape as the drain
	// benchmark, with 4 clients (the 4 processors).
	if _, err := pool.Exec(ctx, "TRUNCATE "+t); err != nil {
		return rows, err
	}
	if err := bulkEnqueue(ctx, s, c.drainN, c.drainGroups); err != nil {
		return rows, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
		return rows, err
	}
	per := c.drainN / 100 / 4
	start := time.Now()
	if _, err := run("claim", claim, 4, "-t", strconv.Itoa(per)); err != nil {
		return rows, err
	}
	rate := float64(per*4*100) / time.Since(start).Seconds()
	rows = append(rows, row{"ceiling: pgbench claim 100 (SKIP LOCKED, no FIFO) + mark sent, 4 clients", fmt.Sprintf("%.0f rows/s", rate)})
	return rows, nil
}
