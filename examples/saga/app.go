package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/sqlite"
	outboxhttp "github.com/outboxkit/outboxkit/transport/http"
)

// Report is what Run observed, for tests.
type Report struct {
	// Sagas maps an order to its saga's state.
	Sagas map[string]string
	// Applied maps an order to the events the order-history service
	// applied, in the order it applied them (type and step).
	Applied map[string][]Event
	// AppliedIDs counts how many times each message was applied.
	AppliedIDs map[string]int
	// Duplicates lists the message IDs the inbox dropped.
	Duplicates []string
	// Crashed is the message whose mark-sent the crash skipped ("" without
	// Options.Crash), and CrashedPublished how many times it was published.
	Crashed          string
	CrashedPublished int
	// Outbox counts the order service's messages by status at the end.
	Outbox map[outbox.Status]int64
}

// timeline prints the saga's timeline, one line per event, from several
// goroutines.
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (t *timeline) printf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, format+"\n", args...)
}

// describe names a message in the timeline: "OrderCreated order-1001 #1".
func describe(payload []byte) string {
	var ev Event
	if json.Unmarshal(payload, &ev) != nil {
		return "?"
	}
	return fmt.Sprintf("%s %s #%d", ev.Type, ev.Order, ev.Step)
}

// history is the order-history service: it applies the order events to its
// projection through its inbox.
type history struct {
	db    *sqlite.Store
	inbox *outbox.Inbox[*sql.Tx]
	tl    *timeline

	mu         sync.Mutex
	duplicates []string
}

const consumerName = "order-history"

// deliver handles one delivery (RabbitMQ, NATS): the inbox record and the
// projection's rows commit together; a redelivered message is dropped.
func (h *history) deliver(ctx context.Context, id, tenant string, payload []byte) error {
	ran := false
	err := h.db.InTx(ctx, func(tx *sql.Tx) error {
		var err error
		ran, err = h.inbox.HandleTx(ctx, tx, consumerName, tenant, id, func(ctx context.Context) error {
			_, err := apply(ctx, tx, id, payload)
			return err
		})
		return err
	})
	switch {
	case err != nil:
		return err
	case ran:
		h.handled(payload)
	default:
		h.duplicate(id, payload)
	}
	return nil
}

func (h *history) handled(payload []byte) {
	h.tl.printf("  order-history  applied            %s", describe(payload))
}

func (h *history) duplicate(id string, payload []byte) {
	h.mu.Lock()
	h.duplicates = append(h.duplicates, id)
	h.mu.Unlock()
	h.tl.printf("  order-history  DUPLICATE dropped  %s (the inbox already has it)", describe(payload))
}

func (h *history) hasDuplicate(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.duplicates, id)
}

// applied returns the events applied per order and per message ID.
func (h *history) applied(ctx context.Context) (map[string][]Event, map[string]int, error) {
	rows, err := h.db.DB().QueryContext(ctx, `SELECT message_id, order_id, type, step FROM applied ORDER BY n`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	byOrder, byID := map[string][]Event{}, map[string]int{}
	for rows.Next() {
		var id string
		var ev Event
		if err := rows.Scan(&id, &ev.Order, &ev.Type, &ev.Step); err != nil {
			return nil, nil, err
		}
		byOrder[ev.Order] = append(byOrder[ev.Order], ev)
		byID[id]++
	}
	return byOrder, byID, rows.Err()
}

// broker is one of the brokers the saga's events travel through.
type broker struct {
	name string
	// pub publishes the order events.
	pub outbox.Publisher
	// consume runs the order-history consumer until ctx ends.
	consume func(ctx context.Context, h *history) error
	close   func()
}

// crashingStore skips recording one message as sent, as if the processor
// crashed between publishing it and marking it sent: the message stays
// PROCESSING until its lease expires, and is then published again. So that
// the example does not wait out the lease (Config.ProcessingTimeout, kept
// long enough for a slow machine), the crashed message's lease is treated as
// expired at the next recovery: recovery takes the messages claimed up to
// its claim, which are the crashed processor's, the rest of its batch
// already finished.
type crashingStore struct {
	outbox.Store
	tl        *timeline
	target    atomic.Pointer[crashTarget]
	crashed   atomic.Bool
	claimedAt atomic.Pointer[time.Time] // the crashed message's claim, until recovered
}

type crashTarget struct{ id, desc string }

func (s *crashingStore) MessageFinish(ctx context.Context, p outbox.MessageFinishParams) (outbox.FinishResult, error) {
	var crashed *crashTarget
	if t := s.target.Load(); t != nil {
		for i, o := range p.Outcomes {
			if o.Kind == outbox.OutcomeSent && o.ID == t.id && s.crashed.CompareAndSwap(false, true) {
				p.Outcomes = append(p.Outcomes[:i:i], p.Outcomes[i+1:]...)
				s.tl.printf("  processor      CRASH              after publishing %s, before marking it sent: it stays PROCESSING until its lease expires", t.desc)
				crashed = t
				break
			}
		}
	}
	res, err := s.Store.MessageFinish(ctx, p)
	if crashed != nil {
		m, gerr := s.MessageGet(ctx, outbox.MessageGetParams{ID: crashed.id})
		if gerr != nil {
			return res, errors.Join(err, gerr)
		}
		s.claimedAt.Store(&m.ClaimedAt)
	}
	return res, err
}

func (s *crashingStore) MessageRecover(ctx context.Context, p outbox.MessageRecoverParams) (outbox.RecoverResult, error) {
	at := s.claimedAt.Load()
	if at != nil {
		p.ClaimedBefore = at.Add(time.Millisecond)
	}
	res, err := s.Store.MessageRecover(ctx, p)
	if err == nil && res.Recovered > 0 {
		s.claimedAt.CompareAndSwap(at, nil)
		s.tl.printf("  processor      lease expired      %d message(s) back to PENDING, to be published again", res.Recovered)
	}
	return res, err
}

// timelinePublisher prints every publish outcome.
type timelinePublisher struct {
	pub       outbox.Publisher
	tl        *timeline
	published sync.Map // message ID -> *atomic.Int32
}

func (p *timelinePublisher) Topics() []string { return p.pub.(*outbox.Router).Topics() }

func (p *timelinePublisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	for _, m := range msgs {
		p.tl.printf("  processor      publishes          %s (attempt %d)", describe(m.Payload), m.Attempts)
	}
	res := p.pub.Publish(ctx, msgs)
	for i, r := range res {
		m := msgs[i]
		switch {
		case r.Err == nil:
			n, _ := p.published.LoadOrStore(m.ID, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		case errors.Is(r.Err, outbox.ErrNotAttempted):
			p.tl.printf("  processor      not attempted      %s: an earlier event of its order failed", describe(m.Payload))
		default:
			info := outbox.ErrorInfoOf(r.Err)
			p.tl.printf("  processor      publish failed     %s (attempt %d): %s %s", describe(m.Payload), m.Attempts, info.Code, info.Message)
		}
	}
	return res
}

func (p *timelinePublisher) count(id string) int {
	if n, ok := p.published.Load(id); ok {
		return int(n.(*atomic.Int32).Load())
	}
	return 0
}

// deadLetters prints dead-lettered messages.
type deadLetters struct {
	outbox.NopObserver
	tl *timeline
}

func (d deadLetters) OnFailed(_ context.Context, e outbox.AttemptEvent) {
	d.tl.printf("  processor      DEAD LETTER        %s after %d attempts: %s (left for manual review)", describe(e.Message.Payload), e.Attempt, e.Message.LastError.Code)
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Run runs the example and prints its timeline to out.
func Run(ctx context.Context, o Options, out io.Writer) (*Report, error) {
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "outbox-saga-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	tl := &timeline{w: out, start: time.Now()}

	orders, err := openDB(ctx, filepath.Join(dir, "orders.db"), orderSchema)
	if err != nil {
		return nil, err
	}
	defer orders.Close()
	hist, err := openDB(ctx, filepath.Join(dir, "history.db"), historySchema)
	if err != nil {
		return nil, err
	}
	defer hist.Close()
	h := &history{db: hist, inbox: outbox.NewInbox[*sql.Tx](hist), tl: tl}

	b, err := newBroker(ctx, o)
	if err != nil {
		return nil, err
	}
	defer b.close()

	// The loyalty service is down for the whole run: its event is retried,
	// then dead-lettered.
	loyalty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
	}))
	defer loyalty.Close()
	loyaltyPub, err := outboxhttp.New(outboxhttp.Config{URL: loyalty.URL})
	if err != nil {
		return nil, err
	}
	pub := &timelinePublisher{tl: tl, pub: outbox.NewRouter().Handle(TopicOrders, b.pub).Handle(TopicLoyalty, loyaltyPub)}
	store := &crashingStore{Store: orders, tl: tl}
	proc, err := outbox.NewProcessor(store, pub, outbox.Config{
		PollInterval:      20 * time.Millisecond,
		ProcessingTimeout: time.Minute, // the lease (see crashingStore)
		RecoveryInterval:  200 * time.Millisecond,
		MaxAttempts:       3,
		Backoff:           outbox.Backoff{Schedule: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		Observer:          deadLetters{tl: tl},
	})
	if err != nil {
		return nil, err
	}
	ob := outbox.New[*sql.Tx](orders, outbox.Options{})

	tl.printf("saga example: SQLite + %s", b.name)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := b.consume(runCtx, h); err != nil && runCtx.Err() == nil {
			errs <- fmt.Errorf("consumer: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := proc.Run(runCtx); err != nil {
			errs <- fmt.Errorf("processor: %w", err)
		}
	}()
	defer func() { stop(); wg.Wait() }()

	rep := &Report{Sagas: map[string]string{}}
	sagas := []struct {
		order Order
		want  int // order events the history applies
	}{
		{Order{ID: "order-1001", Customer: "ada", SKU: "book", Amount: 30}, 3},
		{Order{ID: "order-1002", Customer: "bob", SKU: "book", Amount: 30}, 4}, // bob cannot pay: compensation
		{Order{ID: "order-1003", Customer: "ada", SKU: "book", Amount: 20, Loyalty: true}, 3},
	}
	for i, s := range sagas {
		tl.printf("")
		tl.printf("saga %s: %s orders a %s for %d", s.order.ID, s.order.Customer, s.order.SKU, s.order.Amount)
		state, reason, ids, err := executeSaga(ctx, orders, ob, s.order)
		if err != nil {
			return nil, fmt.Errorf("saga %s: %w", s.order.ID, err)
		}
		rep.Sagas[s.order.ID] = state
		if reason != "" {
			tl.printf("  saga           %s       %s; compensation events enqueued in the same transaction", state, reason)
		} else {
			tl.printf("  saga           %s          %d events enqueued in the saga's transaction", state, len(ids))
		}
		if i == 0 && o.Crash {
			rep.Crashed = ids[0]
			store.target.Store(&crashTarget{id: ids[0], desc: "OrderCreated " + s.order.ID + " #1"})
		}
		proc.Wake()
		// Wait for the history to apply the saga's events (and to drop the
		// crashed event's second delivery), and for a dead letter to land.
		wantFailed := int64(0)
		if s.order.Loyalty {
			wantFailed = 1
		}
		err = waitFor(ctx, errs, func() (bool, error) {
			applied, _, err := h.applied(ctx)
			if err != nil || len(applied[s.order.ID]) < s.want {
				return false, err
			}
			if i == 0 && o.Crash && !h.hasDuplicate(rep.Crashed) {
				return false, nil
			}
			counts, err := orders.MessageCount(ctx, outbox.MessageCountParams{})
			return err == nil && counts[outbox.StatusFailed] >= wantFailed && counts[outbox.StatusPending]+counts[outbox.StatusProcessing] == 0, err
		})
		if err != nil {
			return nil, fmt.Errorf("saga %s: %w", s.order.ID, err)
		}
	}
	stop()
	wg.Wait()

	if rep.Applied, rep.AppliedIDs, err = h.applied(ctx); err != nil {
		return nil, err
	}
	rep.Duplicates = h.duplicates
	if rep.Crashed != "" {
		rep.CrashedPublished = pub.count(rep.Crashed)
	}
	if rep.Outbox, err = orders.MessageCount(ctx, outbox.MessageCountParams{}); err != nil {
		return nil, err
	}
	tl.printf("")
	tl.printf("summary")
	for _, s := range sagas {
		var types []string
		for _, ev := range rep.Applied[s.order.ID] {
			types = append(types, ev.Type)
		}
		tl.printf("  %s  saga %-12s  history applied %s", s.order.ID, rep.Sagas[s.order.ID], strings.Join(types, ", "))
	}
	tl.printf("  outbox: %d sent, %d dead-lettered; inbox: %d duplicate(s) dropped",
		rep.Outbox[outbox.StatusSent], rep.Outbox[outbox.StatusFailed], len(rep.Duplicates))
	return rep, nil
}

// waitFor polls done until it reports true, an error arrives on errs, or
// 60s pass.
func waitFor(ctx context.Context, errs <-chan error, done func() (bool, error)) error {
	deadline := time.After(60 * time.Second)
	for {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errors.New("timed out waiting for the events")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// openDB opens a SQLite store with the outbox (or inbox) tables and the
// service's own schema.
func openDB(ctx context.Context, path, schema string) (*sqlite.Store, error) {
	s, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if _, err := s.DB().ExecContext(ctx, schema); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}
