package mongo_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// cutProxy forwards MongoDB wire messages to the test server and closes
// the client's connection that sends the cutAt-th command named cut
// (counted from 1): the client sees the network fail in the middle of its
// work, once. The command is dropped, or, when late is set, sent to the
// server once the test closes release (a command the client gave up on
// that the server still runs, after what the client did next); lateSent is
// closed once it was.
type cutProxy struct {
	ln       net.Listener
	upstream string
	cut      string
	cutAt    int64
	late     bool
	release  chan struct{}
	lateSent chan struct{}
	seen     atomic.Int64
	wg       sync.WaitGroup
}

func newCutProxy(t *testing.T, upstream, cut string, cutAt int64, late bool) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, upstream: upstream, cut: cut, cutAt: cutAt, late: late,
		release: make(chan struct{}), lateSent: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.wg.Add(2)
		// The replies' copy ends once the server answered after the client
		// side was closed (or the connection ended).
		replied := make(chan struct{})
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); _ = c.Close(); close(replied) }()
		go func() { defer p.wg.Done(); p.requests(c, up, replied); _ = up.Close(); _ = c.Close() }()
	}
}

// requests copies whole wire messages from c to up, reading the command
// name of each OP_MSG (opcode 2013: header, flag bits, then a kind-0
// section whose document's first key is the command).
func (p *cutProxy) requests(c, up net.Conn, replied <-chan struct{}) {
	for {
		var hdr [16]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(hdr[:4]))
		if n < 16 || n > 48<<20 {
			return
		}
		msg := make([]byte, n)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(c, msg[16:]); err != nil {
			return
		}
		if binary.LittleEndian.Uint32(hdr[12:16]) == 2013 && len(msg) > 26 && msg[20] == 0 {
			key := msg[26:]
			if i := strings.IndexByte(string(key), 0); i > 0 && string(key[:i]) == p.cut && p.seen.Add(1) == p.cutAt {
				if !p.late {
					return // drop it and close both ends
				}
				_ = c.Close()
				<-p.release
				_, _ = up.Write(msg)
				select { // the server ran it
				case <-replied:
				case <-time.After(time.Minute):
				}
				close(p.lateSent)
				return
			}
		}
		if _, err := up.Write(msg); err != nil {
			return
		}
	}
}

// TestClaimGivesBackWhatAFailedLeaseLeased: when the connection fails in
// the middle of a claim's lease write, the claim returns an error and its
// messages are PENDING again, attempts uncounted, instead of PROCESSING
// under a lease nobody holds until it expires; also when the server runs
// the lease write after the claim gave up on it, and after the claim gave
// its messages back (the give-back voids the claim first).
func TestClaimGivesBackWhatAFailedLeaseLeased(t *testing.T) {
	t.Parallel()
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			t.Parallel()
			testClaimCut(t, late)
		})
	}
}

func testClaimCut(t *testing.T, late bool) {
	ctx := context.Background()
	direct, _ := newStore(t, mongo.Options{})
	dbName := direct.Database().Name()
	uri := testbackend.MongoURI(t)
	_, hosts, _ := strings.Cut(uri, "://")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		hosts = hosts[at+1:]
	}
	host, _, _ := strings.Cut(strings.SplitN(strings.SplitN(hosts, "/", 2)[0], "?", 2)[0], ",")

	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs, outbox.Message{Topic: "t", Group: fmt.Sprintf("g%d", i%4), Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := outbox.New(direct, outbox.Options{}).Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	// Cut the first update command: the claim's lease (its other writes
	// are inserts and deletes of lock documents).
	proxy := newCutProxy(t, host, "update", 1, late)
	if !late {
		close(proxy.release)
	}
	client, err := mongodrv.Connect(options.Client().ApplyURI(strings.Replace(uri, host, proxy.ln.Addr().String(), 1)).
		SetDirect(true).SetRetryWrites(false).SetTimeout(20 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(ctx)
	viaProxy, err := mongo.New(client.Database(dbName), mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := viaProxy.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 40, Owner: "o", Now: time.Now()})
	if err == nil {
		t.Fatalf("the claim survived a cut connection (%d messages): the test did not cut the lease", len(got))
	}
	t.Logf("the claim failed as the connection was cut: %v", err)
	if late {
		close(proxy.release) // the claim gave its messages back: now the server runs its lease
		select {
		case <-proxy.lateSent:
		case <-time.After(time.Minute):
			t.Fatal("the proxy did not send the late lease write")
		}
	}
	var left []struct {
		ID       string `bson:"_id"`
		Status   string `bson:"status"`
		Attempts int    `bson:"attempts"`
	}
	cur, err := direct.Messages().Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &left); err != nil {
		t.Fatal(err)
	}
	if len(left) != 40 {
		t.Fatalf("%d messages, want 40", len(left))
	}
	for _, m := range left {
		if m.Status != string(outbox.StatusPending) || m.Attempts != 0 {
			t.Fatalf("after a claim cut in its lease, message %s is %s with %d attempts; want PENDING, 0", m.ID, m.Status, m.Attempts)
		}
	}
	// A later claim takes every message, each group in order.
	again, err := direct.MessageClaim(ctx, outbox.MessageClaimParams{Limit: 40, Owner: "o2", Now: time.Now()})
	if err != nil || len(again) != 40 {
		t.Fatalf("claim after the cut: %d messages, %v; want 40", len(again), err)
	}
}
