package seedstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore"
	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
)

// seedDDLMySQL is seed 004's schema, verbatim, one statement per entry.
var seedDDLMySQL = []string{`CREATE TABLE outbox_events (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
)`, `CREATE INDEX idx_outbox_events_status
    ON outbox_events(status, message_group, created_at)`, `CREATE TABLE outbox_dispatch_jobs (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
)`, `CREATE INDEX idx_outbox_dispatch_jobs_status
    ON outbox_dispatch_jobs(status, message_group, created_at)`}

// setupMySQL creates a fresh MySQL/MariaDB database holding the seed's
// tables (by plain SQL) and returns a MySQL Store over them.
func setupMySQL(t testing.TB) *bundle {
	t.Helper()
	tdb := testbackend.MySQL(t, 2)
	dsn, err := seedstore.MySQLDSN(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	for _, stmt := range seedDDLMySQL {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("create tables: %v", err)
		}
	}
	opts := seedstore.Options{EventsTable: tdb.Name + ".outbox_events", DispatchJobsTable: tdb.Name + ".outbox_dispatch_jobs"}
	st, err := seedstore.NewMySQL(db, opts)
	if err != nil {
		t.Fatalf("seedstore.NewMySQL: %v", err)
	}
	return &bundle{db: db, schema: tdb.Name, store: st, opts: opts, mysql: true, dsn: dsn}
}

// An outcome write whose row lock wait times out (error 1205: here another
// transaction holds the row for longer than the server's 1 s wait) is run
// again, and succeeds once the lock is released, instead of failing the
// processor's write.
func TestMySQLFinishRetriesALockWaitTimeout(t *testing.T) {
	t.Parallel()
	b := setupMySQL(t)
	cfg, err := mysql.ParseDSN(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "1" // a session variable set on every connection
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	st, err := seedstore.NewMySQL(db, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	id := b.insert(t, "EVENT", "G", `{}`, t0)
	got := claim(t, st, 10, t0)
	if len(got) != 1 || got[0].ID != id {
		t.Fatalf("claimed %v, want %s", ids(got), id)
	}
	ctx := context.Background()
	lock, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback() }()
	if _, err := lock.Exec(`SELECT id FROM `+b.table("EVENT")+` WHERE id = ? FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(1500 * time.Millisecond) // past the first try's 1 s wait
		_ = lock.Rollback()
	}()
	t.Cleanup(func() { <-released })
	res, err := st.MessageFinish(ctx, outbox.MessageFinishParams{Owner: "p1", Now: time.Now(), Outcomes: []outbox.Outcome{
		{Kind: outbox.OutcomeSent, Topic: got[0].Topic, ID: id, Attempt: got[0].Attempts},
	}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("MessageFinish while the row was locked for 1.5 s: %+v, %v", res, err)
	}
	if r := b.row(t, "EVENT", id); r.Status != "COMPLETED" {
		t.Fatalf("row %+v, want COMPLETED", r)
	}
}

func TestMySQLClaimKeepsFIFOPerGroup(t *testing.T) {
	t.Parallel()
	testClaimKeepsFIFOPerGroup(t, setupMySQL)
}

func TestMySQLFinishOutcomes(t *testing.T) { t.Parallel(); testFinishOutcomes(t, setupMySQL) }

func TestMySQLFinishIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	testFinishIsFencedByTheLease(t, setupMySQL)
}

func TestMySQLProcessorDeliversEverythingInFIFOOrder(t *testing.T) {
	t.Parallel()
	testProcessorDeliversEverythingInFIFOOrder(t, setupMySQL)
}

func TestMySQLProcessorRetriesThenFails(t *testing.T) {
	t.Parallel()
	testProcessorRetriesThenFails(t, setupMySQL)
}

func TestMySQLProcessorRecoversStuckRow(t *testing.T) {
	t.Parallel()
	testProcessorRecoversStuckRow(t, setupMySQL)
}

func TestMySQLIDsSharedAcrossTablesKeepTheirOwnOutcome(t *testing.T) {
	t.Parallel()
	testIDsSharedAcrossTablesKeepTheirOwnOutcome(t, setupMySQL)
}

// Rows written within one second (TIMESTAMP has whole seconds on MySQL)
// keep their order by id, also with two claimers.
func TestMySQLClaimOrdersRowsOfOneSecondByID(t *testing.T) {
	t.Parallel()
	b := setupMySQL(t)
	var want []string
	for i := range 6 {
		want = append(want, b.insert(t, "EVENT", "G", fmt.Sprintf(`{"n":%d}`, i), t0))
	}
	// Another claimer holds the group's first rows (locked, not yet
	// committed): this claim must not take the rows after them.
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec(`SELECT id FROM `+b.table("EVENT")+` WHERE id IN (?, ?) FOR UPDATE`, want[0], want[1]); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, b.store, 10, t0); len(got) != 0 {
		t.Fatalf("claimed %v while the group's head is locked by another claimer", ids(got))
	}
	_ = tx.Rollback()
	got := ids(claim(t, b.store, 4, t0))
	if strings.Join(got, ",") != strings.Join(want[:4], ",") {
		t.Fatalf("claimed %v, want %v", got, want[:4])
	}
}

func TestMySQLRecover(t *testing.T) {
	t.Parallel()
	for _, counts := range []bool{false, true} {
		t.Run(fmt.Sprint("RecoveryCountsAttempt=", counts), func(t *testing.T) {
			t.Parallel()
			b := setupMySQL(t)
			st, err := seedstore.NewMySQL(b.db, seedstore.Options{EventsTable: b.opts.EventsTable, DispatchJobsTable: b.opts.DispatchJobsTable, RecoveryCountsAttempt: counts})
			if err != nil {
				t.Fatal(err)
			}
			stuck := b.insert(t, "EVENT", "G", `{}`, t0)
			last := b.insert(t, "DISPATCH_JOB", "", `{}`, t0)
			fresh := b.insert(t, "EVENT", "", `{}`, t0)
			set := `UPDATE %s SET status = 'PROCESSING', retry_count = ?, processed_at = NOW() - INTERVAL ? MINUTE WHERE id = ?`
			b.exec(t, fmt.Sprintf(set, b.table("EVENT")), 0, 10, stuck)
			b.exec(t, fmt.Sprintf(set, b.table("DISPATCH_JOB")), 3, 10, last)
			b.exec(t, fmt.Sprintf(set, b.table("EVENT")), 0, 1, fresh)
			now := time.Now().Add(24 * time.Hour)
			res, err := st.MessageRecover(context.Background(), outbox.MessageRecoverParams{ClaimedBefore: now.Add(-5 * time.Minute), Now: now, MaxAttempts: 4})
			want := outbox.RecoverResult{Recovered: 2}
			if counts {
				want = outbox.RecoverResult{Recovered: 1, DeadLettered: 1}
			}
			if err != nil || res != want {
				t.Fatalf("recover: %+v, %v, want %+v", res, err, want)
			}
			r := b.row(t, "EVENT", stuck)
			if r.Status != "PENDING" || r.ProcessedAt.Valid || (r.RetryCount == 1) != counts {
				t.Errorf("stuck row %+v, want PENDING, processed_at NULL, retry_count counted: %v", r, counts)
			}
			r = b.row(t, "DISPATCH_JOB", last)
			if counts && (r.Status != "FAILED" || !strings.HasPrefix(r.Error.String, "lease_expired: ")) {
				t.Errorf("row on its last attempt %+v, want FAILED lease_expired", r)
			}
			if !counts && (r.Status != "PENDING" || r.RetryCount != 3) {
				t.Errorf("row on its last attempt %+v, want PENDING with retry_count 3", r)
			}
			if r := b.row(t, "EVENT", fresh); r.Status != "PROCESSING" {
				t.Errorf("row within its lease %+v was recovered", r)
			}
		})
	}
}

func TestMySQLQueriesAndCreateTables(t *testing.T) {
	t.Parallel()
	b := setupMySQL(t)
	ctx := context.Background()
	st, err := seedstore.NewMySQL(b.db, seedstore.Options{EventsTable: b.schema + ".ev2", DispatchJobsTable: b.schema + ".jobs2"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.CreateTables(ctx); err != nil {
			t.Fatalf("CreateTables: %v", err)
		}
	}
	ids, err := st.Insert(ctx, b.db, seedstore.Item{Topic: "EVENT", Group: "g", Payload: []byte(`{"a":1}`)},
		seedstore.Item{Topic: "DISPATCH_JOB", Payload: []byte(`{"b":2}`)})
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	page, err := st.MessageList(ctx, outbox.MessageListParams{Status: outbox.StatusPending})
	if err != nil || len(page.Messages) != 2 || page.Messages[0].ID != ids[0] || page.Messages[0].Group != "g" || page.Messages[1].Group != "default" {
		t.Fatalf("list: %+v, %v", page, err)
	}
	n, err := st.MessageCount(ctx, outbox.MessageCountParams{})
	if err != nil || n[outbox.StatusPending] != 2 {
		t.Fatalf("count: %v, %v", n, err)
	}
	if _, err := st.MessageRequeue(ctx, outbox.MessageRequeueParams{ID: ids[0]}); !errors.Is(err, outbox.ErrInvalidTransition) {
		t.Fatalf("requeue of a PENDING row: %v", err)
	}
	if _, err := seedstore.MySQLDSN("not a dsn"); err == nil {
		t.Error("MySQLDSN accepted a malformed DSN")
	}
}

func TestMySQLReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	testReclaimBeforeForget(t, setupMySQL)
}

func TestMySQLProcessorReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	testProcessorReclaimBeforeForget(t, setupMySQL)
}
