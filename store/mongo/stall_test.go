package mongo_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// TestConcurrentOutcomesDoNotStallTheServer: many processors writing
// outcomes and lease extensions at once all get their answers. FerretDB
// v1.24 keeps the PostgreSQL connection of every single-document update of
// an update command until the whole command ends, and takes one more for
// each write: a few concurrent bulk writes of single-document updates
// exhausted its pool (50 connections) and hung every command on the
// server for good, while the clients timed out (the Mongo processor tier's
// flakes, issue #12). The store's fenced updates are multi-document
// updates over a unique _id (the same on MongoDB), which FerretDB runs one
// after the other on one connection.
//
// On a regression this test hangs the FerretDB it runs against.
func TestConcurrentOutcomesDoNotStallTheServer(t *testing.T) {
	ctx := context.Background()
	direct, _ := newStore(t, mongo.Options{})
	const callers, per = 16, 48
	var msgs []outbox.Message
	for i := range callers * per {
		msgs = append(msgs, outbox.Message{Topic: "t", Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := outbox.New(direct, outbox.Options{}).Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	claims := make([][]outbox.Message, callers)
	for i := range claims {
		got, err := direct.MessageClaim(ctx, outbox.MessageClaimParams{Limit: per, Owner: fmt.Sprint("o", i), Now: time.Now()})
		if err != nil || len(got) != per {
			t.Fatalf("claim %d: %d messages, %v; want %d", i, len(got), err, per)
		}
		claims[i] = got
	}

	// A client with room for every caller at once (the shared test client
	// has a pool of 4).
	client, err := mongodrv.Connect(options.Client().ApplyURI(testbackend.MongoURI(t)).
		SetMaxPoolSize(callers).SetTimeout(60 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(ctx)
	wide, err := mongo.New(client.Database(direct.Database().Name()), mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases := make([]outbox.Lease, per)
			outs := make([]outbox.Outcome, per)
			for j, m := range claims[i] {
				leases[j] = outbox.Lease{Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken}
				outs[j] = outbox.Outcome{Kind: outbox.OutcomeSent, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken}
			}
			owner := fmt.Sprint("o", i)
			for range 2 {
				res, err := wide.MessageExtendLease(ctx, outbox.MessageExtendLeaseParams{Owner: owner, Now: time.Now(), Leases: leases})
				if err != nil || len(res.LeaseLost) > 0 {
					errs[i] = fmt.Errorf("extend: %d lost, %v", len(res.LeaseLost), err)
					return
				}
			}
			res, err := wide.MessageFinish(ctx, outbox.MessageFinishParams{Owner: owner, Now: time.Now(), Outcomes: outs})
			if err != nil || len(res.LeaseLost) > 0 {
				errs[i] = fmt.Errorf("finish: %d lost, %v", len(res.LeaseLost), err)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	c, err := direct.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil {
		t.Fatal(err)
	}
	if c[outbox.StatusSent] != callers*per {
		t.Fatalf("counts %v, want %d SENT", c, callers*per)
	}
}

// TestHeartbeatDoesNotUndoAnOutcome: a lease extension and the outcomes of
// the same leases, written at the same moment by one processor (its
// heartbeat and its recorder), leave every message with its outcome. On
// MongoDB each fenced update is atomic; FerretDB v1.24 reads the matching
// documents of an update first and then writes whole documents back, so an
// extension that read a message before its outcome was written put it
// back to PROCESSING (under a lease its processor had let go: it stayed
// there until the lease expired, then was published again). The store
// writes one owner's extensions and outcomes one at a time.
func TestHeartbeatDoesNotUndoAnOutcome(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t, mongo.Options{})
	const n = 300
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "t", Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := outbox.New(s, outbox.Options{}).Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		got, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: n, Owner: "o", Now: time.Now()})
		if err != nil || len(got) != n {
			t.Fatalf("claim: %d messages, %v; want %d", len(got), err, n)
		}
		leases := make([]outbox.Lease, n)
		outs := make([]outbox.Outcome, n)
		for j, m := range got {
			leases[j] = outbox.Lease{Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken}
			// Released: the messages come back for the next round.
			outs[j] = outbox.Outcome{Kind: outbox.OutcomeReleased, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken}
		}
		var wg sync.WaitGroup
		var extErr, finErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, extErr = s.MessageExtendLease(ctx, outbox.MessageExtendLeaseParams{Owner: "o", Now: time.Now(), Leases: leases})
		}()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(round) * 5 * time.Millisecond)
			var res outbox.FinishResult
			res, finErr = s.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "o", Now: time.Now(), Outcomes: outs})
			if finErr == nil && len(res.LeaseLost) > 0 {
				finErr = fmt.Errorf("%d outcomes refused", len(res.LeaseLost))
			}
		}()
		wg.Wait()
		if extErr != nil || finErr != nil {
			t.Fatalf("round %d: extend %v, finish %v", round, extErr, finErr)
		}
		c, err := s.MessageCount(ctx, outbox.MessageCountParams{})
		if err != nil {
			t.Fatal(err)
		}
		if c[outbox.StatusPending] != n {
			t.Fatalf("round %d: counts %v after releasing every message while its lease was extended; want %d PENDING", round, c, n)
		}
	}
}

// TestPing: Ping answers on the test server and fails, matching no
// success, on a server that is not there.
func TestPing(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t, mongo.Options{})
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	client, err := mongodrv.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1").SetServerSelectionTimeout(500 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(ctx)
	gone, err := mongo.New(client.Database("x"), mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Ping(ctx); err == nil {
		t.Fatal("Ping of a server that is not there returned nil")
	}
}

// TestRecoveryInAnotherProcessSparesANewLease is
// Recover/SparesNewerClaimOfSameOwner with the recovery run by another
// Store (another process) than the owner's claims and releases, so the
// owner's in-process lock does not order them. FerretDB v1.24 checks an
// update's filter only when it reads the documents, then writes them back
// whole: a recovery that read an expired lease overwrote the new lease its
// owner took meanwhile. The recovery writes under the claims' lock
// documents, so no claim leases a message between its read and its write.
func TestRecoveryInAnotherProcessSparesANewLease(t *testing.T) {
	ctx := context.Background()
	s, db := newStore(t, mongo.Options{})
	other, err := mongo.New(db.DB, mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n, rounds = 20, 20
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "t", Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := outbox.New(s, outbox.Options{}).Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond) // every message is due
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var round atomic.Int64
	round.Store(-1)
	stop := make(chan struct{})
	recErr := make(chan error, 1)
	go func() {
		defer close(recErr)
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := round.Load()
			if k < 0 {
				time.Sleep(time.Millisecond)
				continue
			}
			before := at(time.Duration(k)*time.Hour + 30*time.Minute)
			if _, err := other.MessageRecover(ctx, outbox.MessageRecoverParams{ClaimedBefore: before, Now: before, MaxRecoveries: 1000}); err != nil {
				recErr <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-recErr; err != nil {
			t.Errorf("MessageRecover: %v", err)
		}
	}()
	claimAll := func(now time.Time) []outbox.Message {
		var got []outbox.Message
		for deadline := time.Now().Add(30 * time.Second); len(got) < n && time.Now().Before(deadline); {
			c, err := s.MessageClaim(ctx, outbox.MessageClaimParams{Limit: n - len(got), Owner: "p", Now: now})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, c...)
			if len(got) < n {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if len(got) != n {
			t.Fatalf("claimed %d messages, want %d", len(got), n)
		}
		return got
	}
	release := func(ms []outbox.Message, now time.Time) []string {
		p := outbox.MessageFinishParams{Owner: "p", Now: now}
		for _, m := range ms {
			p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeReleased, Topic: m.Topic, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken})
		}
		res, err := s.MessageFinish(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return res.LeaseLost
	}
	recovered := 0
	for k := range rounds {
		start := time.Duration(k) * time.Hour
		old := claimAll(at(start))
		round.Store(int64(k))
		recovered += len(release(old, at(start+40*time.Minute)))
		fresh := claimAll(at(start + 50*time.Minute))
		if lost := release(fresh, at(start+55*time.Minute)); len(lost) > 0 {
			t.Fatalf("round %d: %d leases claimed after the recovery's cutoff lost to a recovery in another process: %v", k, len(lost), lost)
		}
	}
	t.Logf("%d of %d expired leases recovered before their release", recovered, n*rounds)
}
