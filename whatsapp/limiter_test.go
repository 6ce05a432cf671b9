package whatsapp

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// maxInAnySecond returns the most times of ts (sorted) that fall into one
// window of a second, and where that window starts.
func maxInAnySecond(ts []time.Time) (int, time.Time) {
	best, at := 0, time.Time{}
	j := 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		if n := i - j + 1; n > best {
			best, at = n, ts[j]
		}
	}
	return best, at
}

// Real concurrent sends against an HTTP server that notes when each request
// arrives: no one-second window at the server holds more than Throughput
// of them. Sleeps overshoot and requests take varying times to arrive, so
// the limiter keeps a margin; the assertion is the invariant Meta enforces,
// measured where Meta measures it, not a timing figure.
func TestThroughputAtTheServerNeverExceedsTheLimit(t *testing.T) {
	t.Parallel()
	const (
		limit   = 100
		total   = 450
		workers = 50
	)
	var (
		mu       sync.Mutex
		arrivals []time.Time
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		mu.Lock()
		arrivals = append(arrivals, now)
		n := len(arrivals)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"messaging_product":"whatsapp","messages":[{"id":"wamid.T` + time.Duration(n).String() + `"}]}`))
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	p, err := NewPublisher(Config{Credentials: testCreds(), BaseURL: srv.URL, Throughput: limit,
		HTTPClient: &http.Client{Transport: tr, Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	queue := make(chan outbox.Message, total)
	for range total {
		queue <- msg("org-1", templatePayload)
	}
	close(queue)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for m := range queue {
				for {
					r := p.Send(ctx, &m)
					var de *outbox.DeferError
					if r.Err == nil {
						break
					}
					if !asDefer(r.Err, &de) || ctx.Err() != nil {
						t.Errorf("send: %v", r.Err)
						return
					}
					time.Sleep(de.Delay) // the processor's deferral, shortened
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	mu.Lock()
	got := slices.Clone(arrivals)
	mu.Unlock()
	slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
	if len(got) != total {
		t.Fatalf("%d requests arrived, want %d", len(got), total)
	}
	if n, at := maxInAnySecond(got); n > limit {
		t.Fatalf("%d requests arrived in the second from %v (%v after the first), limit %d", n, at.Format("15:04:05.000000"), at.Sub(got[0]), limit)
	}
	// And it keeps pace: 450 sends at 100 per (1 s + a local round trip)
	// take about 4.5 s.
	if max := time.Duration(total/limit+3) * 1200 * time.Millisecond; elapsed > max {
		t.Errorf("%d sends took %v, want under %v", total, elapsed, max)
	}
}

func asDefer(err error, de **outbox.DeferError) bool {
	d, ok := err.(*outbox.DeferError)
	*de = d
	return ok
}

// The same invariant on a simulated clock, with delays a token bucket
// cannot see: each send starts late by a random overshoot, reaches the
// server after a random delay (now and then a long stall), and is answered
// after a random time there. Counted at the server, no one-second window
// holds more than the limit.
func TestLimiterKeepsTheLimitAtTheServerWhateverTheDelays(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	ms := func(n int64) time.Duration { return time.Duration(rng.Int64N(n*int64(time.Millisecond) + 1)) }
	for _, perSecond := range []float64{1, 7.5, 80, 100} {
		l := newLimiter(perSecond)
		p := l.pace("phone")
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		// events: a send wanting to start, or one being answered
		type event struct {
			at       time.Time
			answered bool
		}
		var events []event
		for range int(6 * perSecond) {
			_, wait := l.reserve("phone", t0)
			events = append(events, event{at: t0.Add(wait + ms(30))})
		}
		var arrivals []time.Time
		blocked := 0 // sends waiting for an answer to free a place
		for len(events) > 0 {
			slices.SortStableFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
			e := events[0]
			events = events[1:]
			if e.answered {
				l.answeredAt(p, e.at)
				for ; blocked > 0; blocked-- {
					events = append(events, event{at: e.at})
				}
				continue
			}
			switch d := l.admitAt(p, e.at); {
			case d < 0:
				blocked++
			case d > 0:
				events = append(events, event{at: e.at.Add(d + ms(5))})
			default:
				travel := ms(40)
				if rng.IntN(20) == 0 {
					travel += 300 * time.Millisecond // a stall
				}
				arrive := e.at.Add(travel)
				arrivals = append(arrivals, arrive)
				events = append(events, event{at: arrive.Add(ms(80)), answered: true})
			}
		}
		slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
		if len(arrivals) != int(6*perSecond) {
			t.Fatalf("rate %g: %d sends, want %d", perSecond, len(arrivals), int(6*perSecond))
		}
		if n, at := maxInAnySecond(arrivals); float64(n) > perSecond {
			t.Fatalf("rate %g: %d arrivals in the second from %v", perSecond, n, at.Sub(t0))
		}
		// Not starved: 6 s worth of sends within about 6 x 1.5 s.
		if last := arrivals[len(arrivals)-1].Sub(t0); last > 9*time.Second {
			t.Fatalf("rate %g: the last send arrived after %v", perSecond, last)
		}
	}
}
