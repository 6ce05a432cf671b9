package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
	"github.com/outboxkit/outboxkit/transport/kafka"
)

func openStore(t *testing.T, name string) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), name+".db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// applied is the consumer's business table: one row per applied event.
func createApplied(t *testing.T, s *sqlite.Store) {
	t.Helper()
	if _, err := s.DB().Exec(`CREATE TABLE applied (n INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, grp TEXT NOT NULL, seq INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func applyDelivery(ctx context.Context, tx *sql.Tx, d kafka.Delivery) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO applied (id, grp, seq) VALUES (?, ?, ?)`, d.ID, d.Group, d.Seq)
	return err
}

type appliedRow struct {
	id, grp string
	seq     int64
}

func appliedRows(t *testing.T, s *sqlite.Store) []appliedRow {
	t.Helper()
	rows, err := s.DB().Query(`SELECT id, grp, seq FROM applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []appliedRow
	for rows.Next() {
		var r appliedRow
		if err := rows.Scan(&r.id, &r.grp, &r.seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func consumerClient(t *testing.T, c *kfake.Cluster, group string, topics ...string) *kgo.Client {
	return newClient(t, c, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics...), kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
}

// crashingStore forgets to record one message as sent, as if the processor
// crashed between publishing it and marking it sent: the message stays
// PROCESSING until its lease expires, and is then published again.
type crashingStore struct {
	outbox.Store
	id      string
	crashed atomic.Bool
}

func (s *crashingStore) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	for i, o := range p.Outcomes {
		if o.Kind == outbox.OutcomeSent && o.ID == s.id && s.crashed.CompareAndSwap(false, true) {
			p.Outcomes = append(p.Outcomes[:i:i], p.Outcomes[i+1:]...)
			break
		}
	}
	return s.Store.MessageFinish(ctx, p)
}

// End to end: a processor publishes to Kafka and "crashes" between
// publishing one message and marking it sent; the message is published
// again; the consumer applies every message exactly once, in group order.
func TestEndToEndCrashBetweenPublishAndMarkSent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	producerDB, consumerDB := openStore(t, "producer"), openStore(t, "consumer")
	createApplied(t, consumerDB)

	const groups, per = 4, 5
	ob := outbox.New[*sql.Tx](producerDB, outbox.Options{})
	var msgs []outbox.Message
	for k := range per {
		for g := range groups {
			msgs = append(msgs, outbox.Message{Tenant: "acme", Topic: "orders", Group: fmt.Sprintf("order-%d", g), Payload: json.RawMessage(fmt.Sprintf(`{"step":%d}`, k))})
		}
	}
	enq, err := ob.Enqueue(ctx, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	victim := enq[1].Message.ID // order-1's first message

	pub := newPublisher(t, kafka.Config{Client: newClient(t, c)})
	store := &crashingStore{Store: producerDB, id: victim}
	proc, err := outbox.NewProcessor(store, pub, outbox.Config{
		Topics: []string{"orders"}, PollInterval: 20 * time.Millisecond, ProcessingTimeout: 3 * time.Second, RecoveryInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	var duplicates sync.Map
	var handled atomic.Int32
	cons, err := kafka.NewConsumer(kafka.ConsumerConfig[*sql.Tx]{
		Client: consumerClient(t, c, "billing", "orders"), Inbox: outbox.NewInbox[*sql.Tx](consumerDB), Name: "billing",
		InTx: consumerDB.InTx, Handle: applyDelivery,
		OnDuplicate: func(d kafka.Delivery) { duplicates.Store(d.ID, true) },
		OnHandled:   func(kafka.Delivery) { handled.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	wg.Add(2)
	go func() { defer wg.Done(); _ = proc.Run(runCtx) }()
	go func() { defer wg.Done(); _ = cons.Run(runCtx) }()
	for {
		_, dup := duplicates.Load(victim)
		if dup && len(appliedRows(t, consumerDB)) == len(msgs) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("timed out: duplicate dropped %v, applied %d of %d", dup, len(appliedRows(t, consumerDB)), len(msgs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	wg.Wait()

	if !store.crashed.Load() {
		t.Fatal("the crash was not simulated")
	}
	atts, err := producerDB.AttemptList(ctx, outbox.AttemptListParams{Tenant: "acme", MessageID: victim})
	if err != nil || len(atts) < 2 {
		t.Fatalf("the crashed message was published %d times (err %v), want a second publication", len(atts), err)
	}
	rows := appliedRows(t, consumerDB)
	if int(handled.Load()) != len(rows) {
		t.Fatalf("OnHandled called %d times for %d applied messages", handled.Load(), len(rows))
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, r := range rows {
		if seen[r.id] {
			t.Fatalf("message %s applied twice", r.id)
		}
		seen[r.id] = true
		if r.seq <= last[r.grp] {
			t.Fatalf("group %s applied out of order: %d after %d", r.grp, r.seq, last[r.grp])
		}
		last[r.grp] = r.seq
	}
	for _, e := range enq {
		if !seen[e.Message.ID] {
			t.Fatalf("message %s never applied", e.Message.ID)
		}
	}
}

// The offset is committed only after the handler's transaction commits: a
// record whose handler keeps failing is consumed again by the next consumer,
// and one that was handled is not.
func TestConsumerCommitsAfterTheTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	db := openStore(t, "consumer")
	createApplied(t, db)
	pub := newPublisher(t, kafka.Config{Client: newClient(t, c)})
	msgs := batch("orders", 1, 3, 0) // m-a-0, m-a-1, m-a-2
	for _, r := range pub.Publish(ctx, msgs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	errDown := errors.New("downstream unavailable")
	run := func(failOn string) []string {
		var handled []string
		var mu sync.Mutex
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		cl := consumerClient(t, c, "billing", "orders")
		defer cl.Close() // leave the group, so that the next consumer gets the partition at once
		cons, err := kafka.NewConsumer(kafka.ConsumerConfig[*sql.Tx]{
			Client: cl, Inbox: outbox.NewInbox[*sql.Tx](db), Name: "billing",
			InTx: db.InTx, RetryDelay: 10 * time.Millisecond,
			Handle: func(ctx context.Context, tx *sql.Tx, d kafka.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, d.ID)
				if d.ID == failOn {
					if len(handled) > 5 {
						stop() // give up: the consumer stops with the record unhandled
					}
					return errDown
				}
				return applyDelivery(ctx, tx, d)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cons.Run(runCtx) }()
		deadline := time.After(5 * time.Second)
		for failOn == "" && len(appliedRows(t, db)) < len(msgs) {
			select {
			case <-deadline:
				t.Fatal("the consumer did not apply the records")
			case <-time.After(10 * time.Millisecond):
			}
		}
		if failOn == "" {
			stop()
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return handled
	}
	first := run("m-a-1")
	if first[0] != "m-a-0" || first[len(first)-1] != "m-a-1" || len(first) < 6 {
		t.Fatalf("first consumer handled %v", first)
	}
	if got := appliedRows(t, db); len(got) != 1 {
		t.Fatalf("applied %v, want only m-a-0", got)
	}
	// The next consumer of the group starts after m-a-0 (committed) and
	// handles m-a-1 (its offset was never committed).
	second := run("")
	if len(second) != 2 || second[0] != "m-a-1" || second[1] != "m-a-2" {
		t.Fatalf("second consumer handled %v, want [m-a-1 m-a-2]", second)
	}
}

func TestNewConsumerRefusesAutoCommit(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	db := openStore(t, "consumer")
	base := kafka.ConsumerConfig[*sql.Tx]{
		Inbox: outbox.NewInbox[*sql.Tx](db), Name: "billing", InTx: db.InTx, Handle: applyDelivery,
	}
	for name, cl := range map[string]*kgo.Client{
		"auto commit": newClient(t, c, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("orders")),
		"no group":    newClient(t, c, kgo.ConsumeTopics("orders")),
	} {
		cfg := base
		cfg.Client = cl
		if _, err := kafka.NewConsumer(cfg); err == nil {
			t.Errorf("%s: NewConsumer accepted the client", name)
		}
	}
	cfg := base
	cfg.Client = consumerClient(t, c, "g", "orders")
	if _, err := kafka.NewConsumer(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Name = ""
	if _, err := kafka.NewConsumer(cfg); err == nil {
		t.Error("NewConsumer accepted an empty Name")
	}
}
