package postgres_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// TestFailover builds its own PostgreSQL primary and streaming standby on
// this machine (never the shared server), runs producers and two processors
// (single-active through the Elector, woken by LISTEN) against a multi-host
// connection string with target_session_attrs=read-write, kills the primary
// under load (pg_ctl stop -m immediate) and promotes the standby.
//
// With synchronous replication nothing acknowledged is lost, group order
// holds and duplicates are bounded by the messages in flight at the kill.
// With asynchronous replication the acknowledged messages the standby never
// received are counted and reported; everything the standby has is
// published in order. Both report the time from the promotion to the first
// publication of a message claimed on the new primary.
//
// It runs when OUTBOXKIT_PG_FAILOVER_TEST=1 (about a minute); the server
// binaries come from /usr/lib/postgresql/*/bin.
func TestFailover(t *testing.T) {
	if os.Getenv("OUTBOXKIT_PG_FAILOVER_TEST") != "1" {
		t.Skip("builds a primary and a standby and kills the primary; set OUTBOXKIT_PG_FAILOVER_TEST=1 to run it")
	}
	bin := pgBinDir(t)
	t.Run("synchronous", func(t *testing.T) { failover(t, bin, true) })
	t.Run("asynchronous", func(t *testing.T) { failover(t, bin, false) })
}

// pgBinDir returns the newest /usr/lib/postgresql/*/bin that has the server
// tools the test needs.
func pgBinDir(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		ok := true
		for _, tool := range []string{"initdb", "pg_ctl", "pg_basebackup", "postgres"} {
			if _, err := os.Stat(filepath.Join(d, tool)); err != nil {
				ok = false
			}
		}
		if ok {
			return d
		}
	}
	msg := "no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) under /usr/lib/postgresql/*/bin"
	if os.Getenv("OUTBOXKIT_REQUIRE_BACKENDS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// pgNode is one PostgreSQL server of the test, in a directory of its own.
type pgNode struct {
	t    *testing.T
	bin  string
	dir  string // data directory
	log  string
	port int
	run  func(args ...string) (string, error)
}

func (n *pgNode) ctl(args ...string) {
	n.t.Helper()
	out, err := n.run(append([]string{filepath.Join(n.bin, "pg_ctl"), "-D", n.dir}, args...)...)
	if err != nil {
		logs, _ := os.ReadFile(n.log)
		n.t.Fatalf("pg_ctl %v: %v: %s\n%s", args, err, out, logs)
	}
}

func (n *pgNode) start() { n.ctl("-l", n.log, "-w", "-t", "60", "start") }

// conf appends settings to the node's postgresql.auto.conf (read last, so
// they win over pg_basebackup's primary_conninfo).
func (n *pgNode) conf(lines ...string) {
	n.t.Helper()
	f, err := os.OpenFile(filepath.Join(n.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + strings.Join(lines, "\n") + "\n"); err != nil {
		n.t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// pgServers makes a temporary directory for PostgreSQL servers of a test,
// owned by the postgres OS user when the test runs as root, and returns a
// maker of nodes in it (each on a free port). Every node made is stopped,
// and the directory removed, when t ends (kept when t failed).
func pgServers(t *testing.T, bin string) (root string, node func(name string) *pgNode) {
	t.Helper()
	root, err := os.MkdirTemp("", "outboxkit-pg-")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root and there is no postgres user to run the servers: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatal(err)
		}
		run = func(args ...string) (string, error) {
			out, err := exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...).CombinedOutput()
			return string(out), err
		}
	}
	var nodes []*pgNode
	t.Cleanup(func() {
		for _, n := range slices.Backward(nodes) {
			_, _ = n.run(filepath.Join(bin, "pg_ctl"), "-D", n.dir, "-m", "immediate", "-w", "stop")
		}
		if !t.Failed() {
			_ = os.RemoveAll(root)
		} else {
			t.Logf("server logs kept in %s", root)
		}
	})
	return root, func(name string) *pgNode {
		n := &pgNode{t: t, bin: bin, dir: filepath.Join(root, name), log: filepath.Join(root, name+".log"), port: freePort(t), run: run}
		nodes = append(nodes, n)
		return n
	}
}

// initdb creates n's cluster (user postgres, trust) with settings, and
// starts it. fsync stays off: the tests kill server processes, never the
// machine, so what a server wrote survives in the page cache, and the
// shared machine's disk is spared.
func (n *pgNode) initdb(root string, settings ...string) {
	n.t.Helper()
	if out, err := n.run(filepath.Join(n.bin, "initdb"), "-D", n.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		n.t.Fatalf("initdb: %v: %s", err, out)
	}
	n.conf(append([]string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(n.port),
		"unix_socket_directories = '" + root + "'",
		"fsync = off", "shared_buffers = 32MB",
	}, settings...)...)
	n.start()
}

// pgPair makes a primary on a free port and a streaming standby of it on
// another (see pgServers).
func pgPair(t *testing.T, bin string, syncRep bool) (primary, standby *pgNode) {
	t.Helper()
	root, node := pgServers(t, bin)
	primary, standby = node("primary"), node("standby")
	run := primary.run
	primary.initdb(root, "wal_level = replica", "max_wal_senders = 5", "hot_standby = on", "max_connections = 60")
	if out, err := run(filepath.Join(bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", standby.dir, "-R", "-X", "stream", "--checkpoint=fast"); err != nil {
		t.Fatalf("pg_basebackup: %v: %s", err, out)
	}
	standby.conf(
		"port = "+strconv.Itoa(standby.port),
		fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby1'", primary.port),
	)
	standby.start()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", primary.port))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if syncRep {
		for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = 'standby1'`, `ALTER SYSTEM SET synchronous_commit = 'on'`, `SELECT pg_reload_conf()`} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := "async"
	if syncRep {
		want = "sync"
	}
	for {
		var state string
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'`).Scan(&state)
		if err == nil && state == want {
			return primary, standby
		}
		if ctx.Err() != nil {
			t.Fatalf("the standby did not stream (%s) within a minute: %q %v", want, state, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// publication is one publish call's view of a message.
type publication struct {
	at        time.Time
	claimedAt time.Time
}

func failover(t *testing.T, bin string, syncRep bool) {
	primary, standby := pgPair(t, bin, syncRep)
	// The settings README's "Surviving a failover" section recommends.
	dsn := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=2",
		primary.port, standby.port)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 12
	// pgx does not take libpq's keepalives_* settings: its dialer does.
	cfg.ConnConfig.DialFunc = (&net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3,
	}}).DialContext
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, postgres.Options{Schema: "failover"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New[pgx.Tx](store, outbox.Options{})

	var (
		pubMu sync.Mutex
		pubs  = map[string][]publication{}
		rec   = newPubRecord()
		recP  = rec.publisher(0, nil)
	)
	pub := outbox.PublisherFunc(func(ctx context.Context, ms []outbox.Message) []outbox.Result {
		now := time.Now()
		pubMu.Lock()
		for _, m := range ms {
			pubs[m.ID] = append(pubs[m.ID], publication{at: now, claimedAt: m.ClaimedAt})
		}
		pubMu.Unlock()
		return recP.Publish(ctx, ms)
	})

	// Two replicas in single-active mode: each runs an Elector and a
	// processor gated by it.
	pctx, pcancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	electors := make([]*postgres.Elector, 2)
	for i := range electors {
		el := store.Elector(postgres.ElectorOptions{RetryInterval: 500 * time.Millisecond, CheckInterval: 500 * time.Millisecond})
		electors[i] = el
		p, err := outbox.NewProcessor(store, pub, outbox.Config{
			AllTopics: true, ID: fmt.Sprintf("replica-%d", i), Leader: el,
			PollInterval: 500 * time.Millisecond, MaxErrorBackoff: 2 * time.Second,
			ProcessingTimeout: 5 * time.Second, RecoveryInterval: time.Second, PublishBatchSize: 20,
		})
		if err != nil {
			t.Fatal(err)
		}
		running.Add(2)
		go func() { defer running.Done(); _ = el.Run(pctx, nil) }()
		go func() {
			defer running.Done()
			if err := p.Run(pctx); err != nil {
				t.Errorf("processor %d: %v", i, err)
			}
		}()
	}
	defer func() { pcancel(); running.Wait() }()

	// Producers: a message counts as committed once its Enqueue returned
	// nil; an Enqueue that failed is retried with the same idempotency key
	// until one returns nil.
	var (
		mu        sync.Mutex
		order     = map[string][]string{}
		stop      atomic.Bool
		producers sync.WaitGroup
		failures  atomic.Int64
	)
	for w := range 4 {
		producers.Add(1)
		go func() {
			defer producers.Done()
			group := fmt.Sprintf("g%d", w)
			for i := 0; !stop.Load(); i++ {
				m := msg("t", group, i)
				m.IdempotencyKey = fmt.Sprintf("%s-%d", group, i)
				for ctx.Err() == nil {
					ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
					res, err := ob.Enqueue(ectx, m)
					ecancel()
					if err == nil {
						// A retry may find the message its failed call
						// committed (Existed): that is the one to count.
						mu.Lock()
						order[group] = append(order[group], res[0].Message.ID)
						mu.Unlock()
						break
					}
					if ctx.Err() != nil {
						return
					}
					failures.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(3 * time.Millisecond)
			}
		}()
	}
	waitLeader := func(d time.Duration) (time.Duration, bool) {
		start := time.Now()
		for time.Since(start) < d {
			if electors[0].IsLeader() || electors[1].IsLeader() {
				return time.Since(start), true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return d, false
	}
	if _, ok := waitLeader(30 * time.Second); !ok {
		t.Fatal("no leader was elected on the primary")
	}
	time.Sleep(2 * time.Second)

	// A listener of our own, opened before the kill, shows that LISTEN
	// wake-ups come back on the new primary by themselves.
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	wakeups := store.Wakeups(lctx)

	if !syncRep {
		// An asynchronous standby lags: here it is cut off from the
		// primary for a moment (the primary refuses its reconnections),
		// and what the primary acknowledges meanwhile dies with it.
		hba := filepath.Join(primary.dir, "pg_hba.conf")
		rules, err := os.ReadFile(hba)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(hba, append([]byte("host replication all 127.0.0.1/32 reject\n"), rules...), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_replication`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond)
	}

	// The primary dies under load; the standby is promoted a moment later,
	// as a failover manager would.
	mu.Lock()
	ackedBeforeKill := 0
	for _, ids := range order {
		ackedBeforeKill += len(ids)
	}
	mu.Unlock()
	killedAt := time.Now()
	primary.ctl("-m", "immediate", "-w", "stop")
	time.Sleep(time.Second)
	standby.ctl("-w", "-t", "60", "promote")
	promotedAt := time.Now()
	t.Logf("killed the primary with %d messages acknowledged; promoted the standby %s later", ackedBeforeKill, promotedAt.Sub(killedAt).Round(time.Millisecond))

	// Messages held by a lease on the new primary were in flight at the kill:
	// the only ones that may be published twice.
	var inFlight int64
	for {
		c, err := store.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
		if err == nil {
			inFlight = c[outbox.StatusProcessing]
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the new primary never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	leaderAfter, ok := waitLeader(30 * time.Second)
	if !ok {
		t.Fatal("no leader on the new primary within 30s")
	}

	time.Sleep(3 * time.Second)
	stop.Store(true)
	producers.Wait()
	if failures.Load() == 0 {
		t.Fatal("no enqueue failed: the failover did not happen under load")
	}

	// What the new primary has of the acknowledged messages.
	mu.Lock()
	var all []string
	for _, ids := range order {
		all = append(all, ids...)
	}
	mu.Unlock()
	present := map[string]bool{}
	rows, err := pool.Query(ctx, `SELECT id FROM failover.outbox_messages WHERE id = ANY($1)`, all)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		present[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost, lostPublished := 0, 0
	pubMu.Lock()
	for _, id := range all {
		if !present[id] {
			lost++
			if len(pubs[id]) > 0 {
				lostPublished++
			}
		}
	}
	pubMu.Unlock()
	kept := map[string][]string{}
	for g, ids := range order {
		for _, id := range ids {
			if present[id] {
				kept[g] = append(kept[g], id)
			}
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, err := store.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
		if err == nil && c[outbox.StatusSent] >= int64(len(present)) && c[outbox.StatusPending] == 0 && c[outbox.StatusProcessing] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not everything was published after the failover: %v %v", c, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Group order holds with either replication: after an asynchronous
	// failover the new primary draws again the sequence numbers of what it
	// lost, below the group floors and window starts the store learned on
	// the old primary, which the store then drops (see sawServer).
	dups := rec.check(t, kept)

	// Once enqueues stop the listener waits for notifications only: a wake-up
	// after a quiet second is a notification from the new primary.
	notified := false
	for try := 0; try < 10 && !notified; try++ {
		quiet := time.NewTimer(time.Second)
	drain:
		for {
			select {
			case <-wakeups:
				quiet.Reset(time.Second)
			case <-quiet.C:
				break drain
			}
		}
		m := msg("t", "probe", try)
		if _, err := ob.Enqueue(ctx, m); err != nil {
			t.Fatal(err)
		}
		select {
		case <-wakeups:
			notified = true
		case <-time.After(3 * time.Second):
		}
	}
	if !notified {
		t.Fatal("LISTEN wake-ups did not come back after the failover")
	}

	// Publishing resumed at the first publication of a message claimed
	// after the promotion.
	var resumed time.Time
	pubMu.Lock()
	for _, ps := range pubs {
		for _, p := range ps {
			if p.claimedAt.After(promotedAt) && (resumed.IsZero() || p.at.Before(resumed)) {
				resumed = p.at
			}
		}
	}
	pubMu.Unlock()
	if resumed.IsZero() {
		t.Fatal("nothing claimed after the promotion was published")
	}
	resume := resumed.Sub(promotedAt)

	mode := "asynchronous"
	if syncRep {
		mode = "synchronous"
	}
	t.Logf("FIGURE failover %s replication: %d acknowledged, %d lost (%d of them published before the kill), %d published twice (%d in flight at the kill), "+
		"%d enqueue errors; leader again %s and publishing resumed %s after the promotion (target 5s)",
		mode, len(all), lost, lostPublished, dups, inFlight, failures.Load(), leaderAfter.Round(time.Millisecond), resume.Round(time.Millisecond))
	if syncRep && lost > 0 {
		t.Fatalf("synchronous replication lost %d acknowledged messages", lost)
	}
	if !syncRep {
		if lost == 0 {
			t.Fatal("the standby lagged, yet no acknowledged message was lost: the loss was not measured")
		}
		t.Logf("asynchronous replication: %d acknowledged messages never reached the standby and are gone; "+
			"%d of them had been published, %d never will be", lost, lostPublished, lost-lostPublished)
	}
	if syncRep && int64(dups) > inFlight {
		t.Fatalf("%d duplicates, more than the %d messages in flight at the kill", dups, inFlight)
	}
}
