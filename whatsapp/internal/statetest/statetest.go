// Package statetest is the contract every whatsapp.State implementation
// passes (windows, quotas, inbound dedupe), run by package whatsapp for its
// own states and by whatsapp/redisstate.
package statetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/whatsapp"
)

// recipient is a normalised phone number.
const recipient = "+16505551234"

// Features declares how a State differs where the contract allows it.
type Features struct {
	// ExpiresWindows: the store expires windows by itself (a TTL) and
	// WindowCleanup deletes nothing, so cleanup is not checked.
	ExpiresWindows bool
}

// Run runs the contract against fresh states made by newState, each with
// the quota options it is given, in parallel subtests.
func Run(t *testing.T, newState func(t *testing.T, o whatsapp.QuotaOptions) whatsapp.State, f Features) {
	t.Run("windows", func(t *testing.T) { t.Parallel(); testWindows(t, newState(t, whatsapp.QuotaOptions{}), f) })
	t.Run("quota", func(t *testing.T) {
		t.Parallel()
		testQuota(t, newState(t, whatsapp.QuotaOptions{DefaultLimit: 50, Window: time.Hour}))
	})
	t.Run("quota exact under 100 concurrent senders", func(t *testing.T) {
		t.Parallel()
		testQuotaConcurrent(t, newState(t, whatsapp.QuotaOptions{DefaultLimit: 37}))
	})
	t.Run("dedup", func(t *testing.T) { t.Parallel(); testDedup(t, newState(t, whatsapp.QuotaOptions{})) })
}

func testWindows(t *testing.T, s whatsapp.State, f Features) {
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	if _, ok, err := s.WindowGet(ctx, "org-1", recipient); err != nil || ok {
		t.Fatalf("no window yet: ok=%v err=%v", ok, err)
	}
	if err := s.WindowTouch(ctx, "org-1", recipient, t0); err != nil {
		t.Fatal(err)
	}
	w, ok, err := s.WindowGet(ctx, "org-1", recipient)
	if err != nil || !ok {
		t.Fatalf("window: ok=%v err=%v", ok, err)
	}
	if !w.LastInboundAt.Equal(t0) || !w.ExpiresAt.Equal(t0.Add(whatsapp.SessionWindow)) {
		t.Fatalf("window = %+v, want last inbound %v", w, t0)
	}
	if !w.Open(t0.Add(23*time.Hour+59*time.Minute)) || w.Open(t0.Add(24*time.Hour)) {
		t.Fatal("the window must be open for exactly 24 hours")
	}
	// a late, older webhook does not shorten it; a newer one refreshes it
	if err := s.WindowTouch(ctx, "org-1", recipient, t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if w, _, _ := s.WindowGet(ctx, "org-1", recipient); !w.LastInboundAt.Equal(t0) {
		t.Fatalf("an older inbound moved the window back: %+v", w)
	}
	t1 := t0.Add(time.Minute)
	if err := s.WindowTouch(ctx, "org-1", recipient, t1); err != nil {
		t.Fatal(err)
	}
	if w, _, _ := s.WindowGet(ctx, "org-1", recipient); !w.LastInboundAt.Equal(t1) {
		t.Fatalf("a newer inbound did not refresh: %+v", w)
	}
	// tenants are separate
	if _, ok, _ := s.WindowGet(ctx, "org-2", recipient); ok {
		t.Fatal("org-1's window is visible to org-2")
	}
	// cleanup deletes expired windows only
	if err := s.WindowTouch(ctx, "org-2", "+33612345678", t0.Add(-23*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WindowCleanup(ctx, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.WindowGet(ctx, "org-1", recipient); !ok {
		t.Fatal("cleanup removed an open window")
	}
	if !f.ExpiresWindows {
		if _, ok, _ := s.WindowGet(ctx, "org-2", "+33612345678"); ok {
			t.Fatal("cleanup kept an expired window")
		}
	}
}

func testQuota(t *testing.T, s whatsapp.State) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	st, err := s.QuotaGet(ctx, "org-1", now)
	if err != nil || st.Sent != 0 || st.Limit != 50 || st.Remaining != 50 || st.Throttled {
		t.Fatalf("fresh status = %+v, %v", st, err)
	}
	for i := 1; i <= 50; i++ {
		st, ok, err := s.QuotaConsume(ctx, "org-1", now.Add(time.Duration(i)*time.Second))
		if err != nil || !ok || st.Sent != int64(i) {
			t.Fatalf("consume %d: %+v ok=%v err=%v", i, st, ok, err)
		}
	}
	st, ok, err := s.QuotaConsume(ctx, "org-1", now.Add(time.Minute))
	if err != nil || ok || st.Remaining != 0 || st.Sent != 50 {
		t.Fatalf("over the limit: %+v ok=%v err=%v", st, ok, err)
	}
	if !st.ResetAt.Equal(now.Add(time.Second).Add(time.Hour)) {
		t.Fatalf("ResetAt = %v, want %v (window start + window)", st.ResetAt, now.Add(time.Second).Add(time.Hour))
	}
	// another tenant is separate
	if _, ok, _ := s.QuotaConsume(ctx, "org-2", now); !ok {
		t.Fatal("org-2 refused because of org-1")
	}
	// a per-tenant limit
	if err := s.QuotaSetLimit(ctx, "org-1", 51); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.QuotaConsume(ctx, "org-1", now.Add(time.Minute)); !ok {
		t.Fatal("a raised limit did not allow one more")
	}
	if _, ok, _ := s.QuotaConsume(ctx, "org-1", now.Add(time.Minute)); ok {
		t.Fatal("the raised limit allowed two more")
	}
	if err := s.QuotaSetLimit(ctx, "org-1", 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.QuotaGet(ctx, "org-1", now.Add(time.Minute)); st.Limit != 50 {
		t.Fatalf("limit 0 must restore the default: %+v", st)
	}
	// the window resets
	later := now.Add(time.Second + time.Hour)
	st, ok, err = s.QuotaConsume(ctx, "org-1", later)
	if err != nil || !ok || st.Sent != 1 || !st.ResetAt.Equal(later.Add(time.Hour)) {
		t.Fatalf("after the window: %+v ok=%v err=%v", st, ok, err)
	}
	// throttle: refused until it ends; an earlier throttle does not shorten it
	until := later.Add(10 * time.Minute)
	if err := s.QuotaThrottle(ctx, "org-1", until, later); err != nil {
		t.Fatal(err)
	}
	if err := s.QuotaThrottle(ctx, "org-1", later.Add(time.Minute), later); err != nil {
		t.Fatal(err)
	}
	st, ok, err = s.QuotaConsume(ctx, "org-1", later.Add(5*time.Minute))
	if err != nil || ok || !st.Throttled || !st.ThrottledUntil.Equal(until) || st.Sent != 1 {
		t.Fatalf("throttled: %+v ok=%v err=%v", st, ok, err)
	}
	if _, ok, _ := s.QuotaConsume(ctx, "org-1", until); !ok {
		t.Fatal("still refused when the throttle ended")
	}
	// throttle on a tenant never seen before
	if err := s.QuotaThrottle(ctx, "org-3", until, later); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.QuotaGet(ctx, "org-3", later); !st.Throttled {
		t.Fatalf("org-3: %+v", st)
	}
}

func testQuotaConcurrent(t *testing.T, s whatsapp.State) {
	ctx := context.Background()
	now := time.Now().UTC()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := s.QuotaConsume(ctx, "org-c", now)
			if err != nil {
				errs <- err
				return
			}
			if ok {
				allowed.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := allowed.Load(); n != 37 {
		t.Fatalf("%d of 100 concurrent senders allowed, want exactly 37", n)
	}
	if st, _ := s.QuotaGet(ctx, "org-c", now); st.Sent != 37 || st.Remaining != 0 {
		t.Fatalf("status = %+v", st)
	}
}

func testDedup(t *testing.T, s whatsapp.State) {
	ctx := context.Background()
	now := time.Now()
	for i, want := range []bool{true, false, false} {
		if got, err := s.InboundClaim(ctx, "org-1", "wamid.IN1", now); err != nil || got != want {
			t.Fatalf("claim %d = %v, %v; want %v", i, got, err, want)
		}
	}
	if got, _ := s.InboundClaim(ctx, "org-2", "wamid.IN1", now); !got {
		t.Fatal("the same id in another tenant is a different message")
	}
	if err := s.InboundRelease(ctx, "org-1", "wamid.IN1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.InboundClaim(ctx, "org-1", "wamid.IN1", now); !got {
		t.Fatal("a released id was not claimable again")
	}
}
