package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
	"github.com/outboxkit/outboxkit/store/postgres"
)

// fleetFixture is two fleet instances, "a" and "b", in this process over
// real databases of the test server: three migrated ones and one that
// does not exist ("missing"), each instance with its admin handler.
type fleetFixture struct {
	t       *testing.T
	ctx     context.Context
	dbs     []string // the three real databases, then the missing one
	leaser  *postgres.ShardLeaser
	fleets  map[string]*outbox.Fleet
	srvs    map[string]*httptest.Server
	parked  int // PENDING messages of an unclaimed topic in dbs[0]
	perDB   int // messages of topic "t" enqueued into each real database
	outbox0 *outbox.Outbox[pgx.Tx]
}

func newFleetFixture(t *testing.T) *fleetFixture {
	t.Helper()
	pg := testbackend.Postgres(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	base, err := pgxpool.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	poolFor := func(ctx context.Context, db string) (*pgxpool.Pool, error) {
		cfg := base.Copy()
		cfg.ConnConfig.Database = db
		cfg.MaxConns = 2
		return pgxpool.NewWithConfig(ctx, cfg)
	}
	f := &fleetFixture{t: t, ctx: ctx, fleets: map[string]*outbox.Fleet{}, srvs: map[string]*httptest.Server{}, parked: 3, perDB: 5}
	outboxes := map[string]*outbox.Outbox[pgx.Tx]{}
	for i := range 3 {
		db := fmt.Sprintf("%s_db%d", pg.Name, i)
		if _, err := pg.Pool.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c, err := pgx.Connect(ctx, pg.DSN); err == nil {
				_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
				_ = c.Close(ctx)
			}
		})
		pool, err := poolFor(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := postgres.New(pool, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		f.dbs = append(f.dbs, db)
		outboxes[db] = outbox.New[pgx.Tx](s, outbox.Options{})
	}
	f.outbox0 = outboxes[f.dbs[0]]
	f.dbs = append(f.dbs, pg.Name+"_missing")
	f.leaser = migratedLeaser(ctx, t, pg.Pool, pg.Name)
	// The admin handler's own store: the console's other views need one.
	st, err := postgres.New(pg.Pool, postgres.Options{Schema: pg.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		fl, err := outbox.NewFleet(outbox.FleetConfig{
			ID: id, Databases: outbox.StaticDatabases(f.dbs...), Leaser: f.leaser, LeaseTTL: 2 * time.Second, MaxStoreCalls: 4,
			Publisher: outbox.PublishEach(func(context.Context, outbox.Message) outbox.Result { return outbox.Result{} }),
			Open: func(ctx context.Context, db string) (outbox.ShardStore, error) {
				pool, err := poolFor(ctx, db)
				if err != nil {
					return outbox.ShardStore{}, err
				}
				s, err := postgres.New(pool, postgres.Options{})
				if err != nil {
					pool.Close()
					return outbox.ShardStore{}, err
				}
				return outbox.ShardStore{Store: s, Close: pool.Close}, nil
			},
			// Topic "parked" is not claimed: its messages stay PENDING, the
			// backlog the view counts.
			Processor: outbox.Config{Topics: []string{"t"}, PollInterval: 100 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		fctx, fcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := fl.Run(fctx); err != nil {
				t.Error(err)
			}
		}()
		t.Cleanup(func() { fcancel(); <-done })
		h, err := admin.New(admin.Config{Store: st, Authorize: authorize, Fleet: fl})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("/ops/", http.StripPrefix("/ops", h))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		f.fleets[id], f.srvs[id] = fl, srv
	}

	// Every real database served, the missing one failing, by one
	// instance or the other.
	f.waitFor("the databases taken", func() bool {
		serving, failing := 0, 0
		for _, fl := range f.fleets {
			for _, s := range fl.Status().Shards {
				switch {
				case s.Err != nil:
					failing++
				case s.Health.Healthy && !s.Stopping:
					serving++
				}
			}
		}
		return serving == 3 && failing == 1
	})
	for _, db := range f.dbs[:3] {
		for n := range f.perDB {
			if _, err := outboxes[db].Enqueue(ctx, outbox.Message{Topic: "t", Group: "g", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for n := range f.parked {
		if _, err := f.outbox0.Enqueue(ctx, outbox.Message{Topic: "parked", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitFor("every message of topic t published", func() bool {
		sent := int64(0)
		for _, fl := range f.fleets {
			for _, s := range fl.Status().Shards {
				sent += s.Progress.Sent
			}
		}
		return sent == int64(3*f.perDB)
	})
	return f
}

func (f *fleetFixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("waited 30 s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get sends GET path to instance id's handler with the operator token
// (unless auth is false) and decodes the answer into out.
func (f *fleetFixture) get(id, path string, auth bool, out any) int {
	f.t.Helper()
	req, _ := http.NewRequestWithContext(f.ctx, http.MethodGet, f.srvs[id].URL+"/ops/"+path, nil)
	if auth {
		req.Header.Set("Authorization", token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		f.t.Fatalf("GET %s: %d, %v", path, res.StatusCode, err)
	}
	return res.StatusCode
}

// migratedLeaser returns a ShardLeaser with its tables in schema.
func migratedLeaser(ctx context.Context, t *testing.T, db postgres.DB, schema string) *postgres.ShardLeaser {
	t.Helper()
	leaser, err := postgres.NewShardLeaser(db, postgres.ShardLeaserOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaser.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return leaser
}

// TestFleetView: two fleet instances over real databases; each instance's
// GET api/fleet lists every database with the lease the coordination store
// has (owner, epoch, expiry), and the databases it serves with their
// processor's state, progress, backlog and error kind (never the error's
// text); the other instance's databases show as served elsewhere. The
// console shows the same rows. Bad requests are refused as elsewhere in
// the API.
func TestFleetView(t *testing.T) {
	t.Parallel()
	f := newFleetFixture(t)
	leases, err := f.leaser.ShardList(f.ctx, outbox.ShardListParams{})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]outbox.ShardLease{}
	for _, l := range leases {
		if !l.Expired {
			owner[l.Shard] = l
		}
	}
	if len(owner) != len(f.dbs) {
		t.Fatalf("%d live leases, want %d: %+v", len(owner), len(f.dbs), leases)
	}
	missing := f.dbs[3]

	views := map[string]admin.Fleet{}
	for _, id := range []string{"a", "b"} {
		var v admin.Fleet
		if code := f.get(id, "api/fleet?backlog=true", true, &v); code != 200 {
			t.Fatalf("instance %s: GET api/fleet: %d", id, code)
		}
		views[id] = v
		if v.Instance != id || !slices.Equal(v.Members, []string{"a", "b"}) || v.Databases != 4 || v.Target != 2 || v.Unserved != 0 ||
			v.LeaseTTLSeconds != 2 || v.ListError != "" || v.LeaseError != "" {
			t.Errorf("instance %s: fleet = %+v", id, v)
		}
		if len(v.Shards) != len(f.dbs) {
			t.Fatalf("instance %s: %d shards, want %d: %+v", id, len(v.Shards), len(f.dbs), v.Shards)
		}
		serving := 0
		for i, s := range v.Shards {
			if s.Database != slices.Sorted(slices.Values(f.dbs))[i] || !s.Listed {
				t.Errorf("instance %s: shard %d is %q (listed %v), want the databases in order", id, i, s.Database, s.Listed)
			}
			l := owner[s.Database]
			if s.Owner != l.Owner || s.Epoch != l.Epoch || s.LeaseExpiresAt == nil {
				t.Errorf("instance %s: %s: owner %q epoch %d expires %v; the leaser has %q epoch %d", id, s.Database, s.Owner, s.Epoch, s.LeaseExpiresAt, l.Owner, l.Epoch)
			}
			mine := l.Owner == id
			switch {
			case s.Local != mine:
				t.Errorf("instance %s: %s: local %v, held by %s", id, s.Database, s.Local, l.Owner)
			case !mine:
				if s.State != admin.ShardElsewhere || s.Backlog != nil || s.Sent != 0 || s.Error != "" {
					t.Errorf("instance %s: another instance's %s: %+v, want state elsewhere and nothing local", id, s.Database, s)
				}
			case s.Database == missing:
				if s.State != admin.ShardFailing || s.Healthy || s.Error != "opening the store or starting its processor: the store is unavailable" {
					t.Errorf("instance %s: the missing database: state %s, error %q", id, s.State, s.Error)
				}
				if strings.Contains(s.Error, "127.0.0.1") || strings.Contains(s.Error, missing) {
					t.Errorf("the error's text is echoed: %q", s.Error)
				}
			default:
				serving++
				wantPending := int64(0)
				if s.Database == f.dbs[0] {
					wantPending = int64(f.parked)
				}
				if s.State != admin.ShardServing || !s.Healthy || s.Sent != int64(f.perDB) || s.Claimed != int64(f.perDB) || s.StoreCalls == 0 || s.AcquiredAt == nil {
					t.Errorf("instance %s: its %s: %+v, want serving with %d sent", id, s.Database, s, f.perDB)
				}
				if s.Backlog == nil || s.Backlog.Pending != wantPending || (wantPending > 0) != (s.Backlog.OldestDueAt != nil) {
					t.Errorf("instance %s: %s: backlog %+v, want %d pending", id, s.Database, s.Backlog, wantPending)
				}
			}
		}
		if v.Serving != serving {
			t.Errorf("instance %s: serving %d, its rows say %d", id, v.Serving, serving)
		}
	}
	// Without backlog=true nothing is counted.
	var plain admin.Fleet
	f.get(owner[f.dbs[0]].Owner, "api/fleet", true, &plain)
	for _, s := range plain.Shards {
		if s.Backlog != nil {
			t.Errorf("GET api/fleet without backlog=true counted %s's backlog", s.Database)
		}
	}
	var stats admin.Stats
	if code := f.get("a", "api/stats", true, &stats); code != 200 || !stats.Fleet {
		t.Errorf("api/stats: %d, fleet %v; want it to say a fleet is configured", code, stats.Fleet)
	}

	// Refused as the rest of the API refuses.
	var e struct{ Error string }
	for _, c := range []struct {
		path string
		auth bool
		want int
	}{
		{"api/fleet", false, 401},
		{"api/fleet?colour=red", true, 400},
		{"api/fleet?backlog=maybe", true, 400},
		{"api/fleet?backlog=true&backlog=true&x=", true, 400},
	} {
		e.Error = ""
		if code := f.get("a", c.path, c.auth, &e); code != c.want || e.Error == "" {
			t.Errorf("GET %s (token %v): %d %q, want %d with an error message", c.path, c.auth, code, e.Error, c.want)
		}
	}
	// Read-only: a POST is not a route.
	req, _ := http.NewRequestWithContext(f.ctx, http.MethodPost, f.srvs["a"].URL+"/ops/api/fleet", strings.NewReader("{}"))
	req.Header.Set("Authorization", token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode/100 != 4 {
		t.Errorf("POST api/fleet: %d, want a 4xx", res.StatusCode)
	}

	t.Run("console", func(t *testing.T) {
		tb := newTab(t, sharedBrowser(t), false)
		id := owner[f.dbs[0]].Owner
		tb.open(f.srvs[id].URL + "/ops/")
		tb.wait("the fleet section", `!document.getElementById("fleet").hidden && !document.getElementById("nav-fleet").hidden && document.querySelectorAll("#fleet-table tbody tr[data-database]").length === 4`)
		for _, s := range views[id].Shards {
			row := `#fleet-table tr[data-database="` + s.Database + `"]`
			if got := tb.eval(`document.querySelector('` + row + `').dataset.state`); got != s.State {
				t.Errorf("%s: the console shows state %q, the API %q", s.Database, got, s.State)
			}
			if got := tb.text(row + ` td[data-owner]`); !strings.HasPrefix(got, s.Owner) {
				t.Errorf("%s: the owner cell reads %q, want %s first", s.Database, got, s.Owner)
			}
			if s.State == admin.ShardServing {
				if got := tb.text(row + ` td[data-sent]`); got != fmt.Sprint(f.perDB) {
					t.Errorf("%s: the sent cell reads %q, want %d", s.Database, got, f.perDB)
				}
			}
			if s.State == admin.ShardFailing {
				if cls := tb.eval(`document.querySelector('` + row + ` td[data-state]').className`); cls != "bad" {
					t.Errorf("%s: the failing state is not marked (class %q)", s.Database, cls)
				}
			}
		}
		if got := tb.text(`#fleet-table tr[data-database="` + f.dbs[0] + `"] td[data-pending]`); got != fmt.Sprint(f.parked) {
			t.Errorf("%s: the due pending cell reads %q, want %d", f.dbs[0], got, f.parked)
		}
		if os.Getenv("OUTBOXKIT_SCREENSHOTS") != "" {
			shoot(t, tb, "console-fleet.png", "fleet")
		}
		if got := tb.text(`#fleet-summary`); !strings.Contains(got, "Instance "+id+" of 2 (a, b)") || !strings.Contains(got, "4 databases listed, 0 unserved") {
			t.Errorf("the summary reads %q", got)
		}
	})
}
