package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// logSink collects log records for assertions.
type logSink struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	s.recs = append(s.recs, r.Clone())
	s.mu.Unlock()
	return nil
}
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *logSink) WithGroup(string) slog.Handler      { return s }

// find returns the records with message msg, each as its attributes.
func (s *logSink) find(msg string) []map[string]slog.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range s.recs {
		if r.Message != msg {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		out = append(out, attrs)
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNewProcessorRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ok := outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		return make([]outbox.Result, len(ms))
	})
	var nilFunc outbox.PublisherFunc
	var nilRouter *outbox.Router
	for _, tt := range []struct {
		name string
		pub  outbox.Publisher
		cfg  outbox.Config
		want string
	}{
		{"empty router", outbox.NewRouter(), outbox.Config{}, "no routes"},
		{"nil publisher in a route", outbox.NewRouter().Handle("a", ok).Handle("b", nil), outbox.Config{}, `topic "b" is nil`},
		{"nil PublisherFunc in a route", outbox.NewRouter().Handle("a", nilFunc), outbox.Config{}, `topic "a" is nil`},
		{"empty topic in a route", outbox.NewRouter().Handle(" ", ok), outbox.Config{}, "topic is empty"},
		{"nil publisher", nil, outbox.Config{}, "publisher"},
		{"nil PublisherFunc", nilFunc, outbox.Config{}, "nil PublisherFunc"},
		{"nil router", nilRouter, outbox.Config{}, "nil *Router"},
		{"publisher without topics", ok, outbox.Config{}, "AllTopics"},
		{"all topics and a list", ok, outbox.Config{AllTopics: true, Topics: []string{"a"}}, "choose one"},
		{"blank topic", ok, outbox.Config{Topics: []string{" "}}, "empty topic"},
		{"topic without a route", outbox.NewRouter().Handle("a", ok), outbox.Config{Topics: []string{"a", "b"}}, `names topic "b", which the publisher has no route for`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := outbox.NewProcessor(st, tt.pub, tt.cfg)
			if !errors.Is(err, outbox.ErrInvalidInput) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewProcessor = %v, %v; want an ErrInvalidInput mentioning %q", p, err, tt.want)
			}
		})
	}
	// The explicit choices work.
	if _, err := outbox.NewProcessor(st, ok, outbox.Config{AllTopics: true}); err != nil {
		t.Fatalf("AllTopics: %v", err)
	}
	if _, err := outbox.NewProcessor(st, ok, outbox.Config{Topics: []string{"a"}}); err != nil {
		t.Fatalf("Topics: %v", err)
	}
}

// An empty router must not dead-letter anything: the processor never
// starts, and another tenant's pending message stays PENDING.
func TestEmptyRouterDeadLettersNothing(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ob := outbox.New(st, outbox.Options{})
	if _, err := ob.Enqueue(context.Background(), outbox.Message{Tenant: "other", Topic: "x", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := outbox.Run(ctx, st, outbox.NewRouter(), outbox.Config{PollInterval: time.Millisecond}); !errors.Is(err, outbox.ErrInvalidInput) {
		t.Fatalf("Run with an empty router = %v, want ErrInvalidInput", err)
	}
	c, err := st.MessageCount(ctx, outbox.MessageCountParams{AllTenants: true})
	if err != nil || c[outbox.StatusPending] != 1 || c[outbox.StatusFailed] != 0 {
		t.Fatalf("counts = %v, %v; want the message still PENDING", c, err)
	}
}

func TestProcessorLogsTheTopicsItClaims(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	rec := &outboxtest.Recorder{}
	for _, tt := range []struct {
		cfg  outbox.Config
		pub  outbox.Publisher
		want string
	}{
		{outbox.Config{AllTopics: true}, rec, "all topics"},
		{outbox.Config{}, outbox.NewRouter().Handle("b", rec).Handle("a", rec), "[a b]"},
	} {
		sink := &logSink{}
		tt.cfg.Logger = slog.New(sink)
		p, err := outbox.NewProcessor(st, tt.pub, tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, p)
		eventually(t, "the start log", func() bool { return len(sink.find("outbox processor started")) == 1 })
		stop()
		if got := sink.find("outbox processor started")[0]["topics"].String(); got != tt.want {
			t.Fatalf("logged topics %q, want %q", got, tt.want)
		}
	}
}

func TestRunReturnsAClearErrorWhenItCannotStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &outboxtest.Recorder{}

	// Tables never created: the error says to call Migrate.
	unmigrated, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer unmigrated.Close()
	sink := &logSink{}
	err = outbox.Run(ctx, unmigrated, rec, outbox.Config{AllTopics: true, PollInterval: time.Millisecond, Logger: slog.New(sink)})
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "call the store's Migrate") {
		t.Fatalf("Run on an unmigrated store = %v; want ErrNotMigrated naming Migrate", err)
	}
	if n := len(sink.find("claim failed")); n != 0 {
		t.Fatalf("%d claims attempted on an unmigrated store, want none", n)
	}

	// Store unreachable (closed).
	closed := newStore(t)
	_ = closed.Close()
	err = outbox.Run(ctx, closed, rec, outbox.Config{AllTopics: true})
	if !errors.Is(err, outbox.ErrStoreUnavailable) || errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Run on a closed store = %v; want ErrStoreUnavailable", err)
	}
}

// A store that fails after start: claims back off (doubling, capped), and
// Health says so.
func TestProcessorBacksOffAndReportsHealthOnStoreErrors(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	sink := &logSink{}
	p, err := outbox.NewProcessor(st, &outboxtest.Recorder{}, outbox.Config{
		AllTopics: true, PollInterval: 2 * time.Millisecond, MaxErrorBackoff: 20 * time.Millisecond,
		Logger: slog.New(sink),
	})
	if err != nil {
		t.Fatal(err)
	}
	if h := p.Health(); h.Running || h.Healthy {
		t.Fatalf("health before Run = %+v, want not running", h)
	}
	stop := start(t, p)
	eventually(t, "healthy", func() bool { return p.Health().Healthy })
	_ = st.Close()
	eventually(t, "six failed claims", func() bool { return len(sink.find("claim failed")) >= 6 })
	h := p.Health()
	if !h.Running || h.Healthy || h.Err == nil || h.ConsecutiveFailures < 6 {
		t.Fatalf("health with a closed store = %+v; want running, unhealthy, with the error", h)
	}
	var waits []time.Duration
	for _, a := range sink.find("claim failed")[:6] {
		waits = append(waits, a["retry_in"].Duration())
	}
	want := []time.Duration{4 * time.Millisecond, 8 * time.Millisecond, 16 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits after consecutive failures = %v, want %v", waits, want)
		}
	}
	stop()
	if h := p.Health(); h.Running || h.Healthy {
		t.Fatalf("health after Run returned = %+v, want not running", h)
	}
}

func TestWaitDrainedAndProgress(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ids := enqueue(t, st, 40, func(i int) string { return []string{"a", "b", ""}[i%3] })
	failing := ids[0]
	pub := outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		out := make([]outbox.Result, len(ms))
		for i := range ms {
			if ms[i].ID == failing {
				out[i].Err = outbox.Permanent("bad", "refused")
			}
		}
		return out
	})
	p, err := outbox.NewProcessor(st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: time.Hour, PublishBatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// PollInterval is an hour: WaitDrained must wake the poller itself.
	if err := p.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	c := counts(t, st)
	if c[outbox.StatusSent] != 39 || c[outbox.StatusFailed] != 1 || c[outbox.StatusPending] != 0 {
		t.Fatalf("counts after WaitDrained = %v; want 39 SENT, 1 FAILED", c)
	}
	pr := p.Progress()
	if pr.Claimed != 40 || pr.Sent != 39 || pr.DeadLettered != 1 || pr.InFlight != 0 {
		t.Fatalf("progress = %+v", pr)
	}
	// More work later: a second WaitDrained covers it.
	enqueue(t, st, 5, func(int) string { return "a" })
	if err := p.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	if c := counts(t, st); c[outbox.StatusSent] != 44 {
		t.Fatalf("counts after the second WaitDrained = %v", c)
	}
	stop()
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := p.WaitDrained(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDrained on a stopped processor = %v, want the ctx error", err)
	}
}

// A topic nobody routes is reported (log and Progress), not left silent.
func TestProcessorReportsUnroutedTopics(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	t0 := time.Now().UTC()
	clock := outboxtest.NewClock(t0)
	ob := outbox.New(st, outbox.Options{Clock: clock})
	if _, err := ob.Enqueue(context.Background(),
		outbox.Message{Tenant: "acme", Topic: "sms", Payload: []byte(`{}`)},
		outbox.Message{Tenant: "other", Topic: "sms", Payload: []byte(`{}`)},
		outbox.Message{Topic: "t", Payload: []byte(`{}`)},
	); err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Minute)
	sink := &logSink{}
	rec := &outboxtest.Recorder{}
	p, err := outbox.NewProcessor(st, outbox.NewRouter().Handle("t", rec), outbox.Config{
		PollInterval: 5 * time.Millisecond, RecoveryInterval: 5 * time.Millisecond, UnroutedAfter: 5 * time.Minute,
		Clock: clock, Logger: slog.New(sink),
	})
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)
	eventually(t, "the unrouted report", func() bool { return len(p.Progress().Unrouted) > 0 })
	un := p.Progress().Unrouted
	if len(un) != 1 || un[0].Topic != "sms" || un[0].Messages != 2 || !un[0].OldestDueAt.Equal(t0.Truncate(time.Microsecond)) {
		t.Fatalf("unrouted = %+v; want sms with 2 messages due since %v", un, t0)
	}
	logs := sink.find("topic has messages that no processor claims: route it (Router.Handle) in some processor, or cancel them")
	if len(logs) == 0 || logs[0]["topic"].String() != "sms" {
		t.Fatalf("warning logs = %v", logs)
	}
}

func TestPublisherPanicIsLoggedWithItsStack(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	enqueue(t, st, 1, func(int) string { return "" })
	var once sync.Once
	pub := outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		once.Do(func() { panicInPublisher() })
		return make([]outbox.Result, len(ms))
	})
	sink := &logSink{}
	p, err := outbox.NewProcessor(st, pub, outbox.Config{Topics: []string{"t"}, PollInterval: 5 * time.Millisecond,
		Backoff: outbox.Backoff{Schedule: []time.Duration{time.Millisecond}}, Logger: slog.New(sink)})
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)
	outboxtest.WaitDrained(t, st, "", 20*time.Second)
	logs := sink.find("publisher panicked")
	if len(logs) != 1 || !strings.Contains(logs[0]["stack"].String(), "panicInPublisher") {
		t.Fatalf("panic logs = %v; want one with a stack naming the panicking function", logs)
	}
}

func panicInPublisher() { panic("boom") }

func TestRouterLogsMissingResults(t *testing.T) {
	t.Parallel()
	sink := &logSink{}
	r := outbox.NewRouter().Handle("short", outbox.PublisherFunc(func(context.Context, []outbox.Message) []outbox.Result {
		return nil
	}))
	r.SetLogger(slog.New(sink))
	res := r.Publish(context.Background(), []outbox.Message{{Topic: "short"}, {Topic: "short"}})
	if !outbox.IsRetryable(res[0].Err) || !outbox.IsRetryable(res[1].Err) {
		t.Fatalf("results = %v; want retryable missing_result errors", res)
	}
	logs := sink.find("publisher returned a wrong number of results; the missing ones are retried")
	if len(logs) != 1 || logs[0]["topic"].String() != "short" || logs[0]["results"].Int64() != 0 {
		t.Fatalf("logs = %v", logs)
	}
}

// pingStore is a Store with a Ping that counts its calls and fails when
// told to.
type pingStore struct {
	*sqlite.Store
	pings atomic.Int64
	err   error
}

func (s *pingStore) Ping(context.Context) error {
	s.pings.Add(1)
	return s.err
}

// A store that implements Pinger is probed with Ping at start-up (not a
// listing): its error stops Run as ErrStoreUnavailable, its success lets
// the processor start.
func TestRunProbesAPingerWithPing(t *testing.T) {
	t.Parallel()
	pub := outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) []outbox.Result {
		return make([]outbox.Result, len(ms))
	})
	down := &pingStore{Store: newStore(t), err: errors.New("connection refused")}
	p, err := outbox.NewProcessor(down, pub, outbox.Config{Topics: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); !errors.Is(err, outbox.ErrStoreUnavailable) || down.pings.Load() != 1 {
		t.Fatalf("Run = %v after %d pings, want ErrStoreUnavailable after 1", err, down.pings.Load())
	}
	up := &pingStore{Store: newStore(t)}
	p, err = outbox.NewProcessor(up, pub, outbox.Config{Topics: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	eventually(t, "the processor running", func() bool { return p.Health().Running })
	cancel()
	if err := <-done; err != nil || up.pings.Load() != 1 {
		t.Fatalf("Run = %v after %d pings, want nil after 1", err, up.pings.Load())
	}
}
