package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/postgres"
	"github.com/outboxkit/outboxkit/outbox"
)

func TestProcessorDeliversEverythingInFIFOOrder(t *testing.T) {
	t.Parallel()
	seedtest.ProcessorDeliversEverythingInFIFOOrder(t, setup)
}

func TestProcessorRetriesThenFails(t *testing.T) {
	t.Parallel()
	seedtest.ProcessorRetriesThenFails(t, setup)
}

func TestProcessorRecoversStuckRow(t *testing.T) {
	t.Parallel()
	seedtest.ProcessorRecoversStuckRow(t, setup)
}

func TestProcessorSmallBufferLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		return &flowcatalysttest.Response{Delay: 3 * time.Millisecond, Continue: true}
	})
	groups := map[string]int{}
	for g := range 10 {
		groups[fmt.Sprint("g", g)] = 15
	}
	groups[""] = 30
	b.InsertGroups(t, "EVENT", groups)
	pub, _ := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 2})
	cfg := seedtest.FastConfig()
	cfg.BufferSize, cfg.PollBatchSize, cfg.PublishBatchSize, cfg.MaxConcurrentGroups = 4, 4, 2, 2
	seedtest.Run(t, b.Store, pub, cfg)
	seedtest.WaitFor(t, "every row COMPLETED", 60*time.Second, func() bool { return b.CountStatus(t, "COMPLETED") == 180 })
	seedtest.CheckFIFO(t, srv.Items(flowcatalyst.CurrentAPI.EventsPath), groups)
}

func TestProcessorReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	seedtest.ProcessorReclaimBeforeForget(t, setup)
}

// countingStore counts the claims a processor makes and remembers how many
// rows the first one returned.
type countingStore struct {
	*postgres.Store
	claims atomic.Int64
	first  atomic.Int64
}

func (c *countingStore) MessageClaim(ctx context.Context, p outbox.MessageClaimParams) ([]outbox.Message, error) {
	msgs, err := c.Store.MessageClaim(ctx, p)
	if c.claims.Add(1) == 1 {
		c.first.Store(int64(len(msgs)))
	}
	return msgs, err
}

// A fresh table (no statistics: the server's autovacuum may be off, and the
// rows were just inserted) must not stall the start: the first claim fills
// the poll batch and the first request goes out within one poll interval.
func TestFirstSendOnAFreshTableWithinOnePollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, topic := range []string{"EVENT", "DISPATCH_JOB"} {
		// 2,500 rows in 50 groups, by plain SQL, as an application would.
		b.Exec(t, `INSERT INTO `+b.Table(topic)+` (id, type, message_group, payload, status, retry_count, created_at)
SELECT 'R' || i, $1, 'group-' || (i % 50), '{"n":' || i || '}', 'PENDING', 0, now() - interval '1 hour' + i * interval '1 millisecond'
FROM generate_series(1, 2500) AS i`, topic)
	}
	// The reference: seed 004's own fetch-and-lock of 500 rows on the same
	// table, rolled back. It scales the allowance with the machine's load.
	ref := time.Now()
	tx, err := b.DB.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`WITH selected AS (
    SELECT id FROM ` + b.Table("EVENT") + ` WHERE status = 'PENDING'
    ORDER BY message_group, created_at LIMIT 500 FOR UPDATE SKIP LOCKED)
UPDATE ` + b.Table("EVENT") + ` t SET status = 'PROCESSING', processed_at = NOW()
FROM selected s WHERE t.id = s.id RETURNING t.*`); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	seedClaim := time.Since(ref)

	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	cs := &countingStore{Store: b.Store.(*postgres.Store)}
	var once sync.Once
	first := make(chan int64, 1)
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		once.Do(func() { first <- cs.claims.Load() })
		return nil
	})
	pub, err := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cfg := seedtest.FastConfig()
	cfg.PollInterval = time.Second
	cfg.PollBatchSize, cfg.PublishBatchSize, cfg.BufferSize = 500, 100, 1000
	p, err := outbox.NewProcessor(cs, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case n := <-first:
		if got := cs.first.Load(); n < 1 || got != int64(cfg.PollBatchSize) {
			t.Errorf("the first claim returned %d rows, want a full poll batch (%d)", got, cfg.PollBatchSize)
		}
		if d, allowed := time.Since(start), cfg.PollInterval+10*seedClaim; d > allowed {
			t.Errorf("the first request went out %s after the start, more than one poll interval (%s) plus 10 times the seed's own claim (%s)", d, cfg.PollInterval, seedClaim)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no request within 60 s of the start")
	}
	seedtest.WaitFor(t, "every row COMPLETED", 60*time.Second, func() bool { return b.CountStatus(t, "COMPLETED") == 5000 })
}
