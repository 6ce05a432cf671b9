package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// wantApplied is the order-history projection every run must reach.
var wantApplied = map[string][]string{
	"order-1001": {"OrderCreated", "StockReserved", "PaymentCharged"},
	"order-1002": {"OrderCreated", "StockReserved", "StockReleased", "OrderCancelled"},
	"order-1003": {"OrderCreated", "StockReserved", "PaymentCharged"},
}

func run(t *testing.T, o Options) (*Report, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, o, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return rep, out.String()
}

// checkReport asserts what the saga promises whatever the broker: every
// event applied exactly once, each order's in order; the sagas' states; the
// dead letter; with Crash, the crashed event published twice and dropped
// once by the inbox.
func checkReport(t *testing.T, rep *Report, crash bool) {
	t.Helper()
	for id, n := range rep.AppliedIDs {
		if n != 1 {
			t.Errorf("message %s applied %d times", id, n)
		}
	}
	for order, types := range wantApplied {
		got := rep.Applied[order]
		if len(got) != len(types) {
			t.Fatalf("%s: applied %v, want %v", order, got, types)
		}
		for i, ev := range got {
			if ev.Type != types[i] || ev.Step != i+1 {
				t.Fatalf("%s: applied %v, want %v in order", order, got, types)
			}
		}
	}
	if rep.Sagas["order-1001"] != SagaCompleted || rep.Sagas["order-1002"] != SagaCompensating || rep.Sagas["order-1003"] != SagaCompleted {
		t.Errorf("sagas %v", rep.Sagas)
	}
	if rep.Outbox[outbox.StatusSent] != 10 || rep.Outbox[outbox.StatusFailed] != 1 {
		t.Errorf("outbox %v, want 10 SENT and 1 FAILED (the loyalty event)", rep.Outbox)
	}
	if !crash {
		if len(rep.Duplicates) != 0 {
			t.Errorf("duplicates %v without a crash", rep.Duplicates)
		}
		return
	}
	if rep.Crashed == "" || rep.CrashedPublished < 2 {
		t.Errorf("crashed message %q published %d times, want at least 2", rep.Crashed, rep.CrashedPublished)
	}
	if len(rep.Duplicates) == 0 || rep.Duplicates[0] != rep.Crashed {
		t.Errorf("inbox dropped %v, want the crashed message %s", rep.Duplicates, rep.Crashed)
	}
}

// `go run ./examples/saga` (Kafka in process, no crash) prints the
// timeline: each saga, the order-history's applications in order, the dead
// letter, and the summary.
func TestOutput(t *testing.T) {
	t.Parallel()
	rep, out := run(t, Options{})
	checkReport(t, rep, false)
	for _, want := range []string{
		"saga example: SQLite + Kafka (in-process kfake)\n",
		"saga order-1002: bob orders a book for 30\n  saga           COMPENSATING       payment declined: insufficient funds; compensation events enqueued in the same transaction\n",
		"  processor      DEAD LETTER        LoyaltyPointsAwarded order-1003 #4 after 3 attempts: http_503 (left for manual review)\n",
		"\nsummary\n" +
			"  order-1001  saga COMPLETED     history applied OrderCreated, StockReserved, PaymentCharged\n" +
			"  order-1002  saga COMPENSATING  history applied OrderCreated, StockReserved, StockReleased, OrderCancelled\n" +
			"  order-1003  saga COMPLETED     history applied OrderCreated, StockReserved, PaymentCharged\n" +
			"  outbox: 10 sent, 1 dead-lettered; inbox: 0 duplicate(s) dropped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The timeline's applications, per order, in step order.
	applied := regexp.MustCompile(`order-history  applied            (\w+) (order-\d+) #(\d+)`).FindAllStringSubmatch(out, -1)
	got := map[string][]string{}
	for _, m := range applied {
		got[m[2]] = append(got[m[2]], m[1])
	}
	for order, types := range wantApplied {
		if strings.Join(got[order], ",") != strings.Join(types, ",") {
			t.Errorf("timeline applied %v for %s, want %v", got[order], order, types)
		}
	}
	if n := strings.Count(out, "publish failed     LoyaltyPointsAwarded"); n != 3 {
		t.Errorf("the loyalty event failed %d times in the timeline, want 3", n)
	}
}

// For each broker: the processor crashes between publishing an event and
// marking it sent; the event is published again and the consumer applies
// every event exactly once, in order.
func TestCrashKafka(t *testing.T) {
	t.Parallel()
	rep, out := run(t, Options{Broker: "kafka", Crash: true})
	checkReport(t, rep, true)
	for _, want := range []string{
		"  processor      CRASH              after publishing OrderCreated order-1001 #1, before marking it sent",
		"  order-history  DUPLICATE dropped  OrderCreated order-1001 #1 (the inbox already has it)",
		"inbox: 1 duplicate(s) dropped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Published again after the lease expired, still as attempt 1: the
	// lost lease is not counted as an attempt.
	if n := strings.Count(out, "publishes          OrderCreated order-1001 #1 (attempt 1)"); n != 2 {
		t.Errorf("OrderCreated order-1001 published %d times as attempt 1, want 2 (before the crash and after recovery):\n%s", n, out)
	}
}

func TestCrashRabbitMQ(t *testing.T) {
	t.Parallel()
	rep, _ := run(t, Options{Broker: "rabbitmq", AMQPURL: testbackend.AMQPURL(t), Crash: true})
	checkReport(t, rep, true)
}

func TestCrashNATS(t *testing.T) {
	t.Parallel()
	rep, _ := run(t, Options{Broker: "nats", NATSURL: testbackend.NATSURL(t), Crash: true})
	checkReport(t, rep, true)
}

func TestUnknownBroker(t *testing.T) {
	t.Parallel()
	if _, err := Run(context.Background(), Options{Broker: "carrier-pigeon"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "unknown broker") {
		t.Fatalf("err %v", err)
	}
}
