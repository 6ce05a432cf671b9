package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedtest"
	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/mysql"
	"github.com/outboxkit/outboxkit/outbox"
)

// An outcome write whose row lock wait times out (error 1205: here another
// transaction holds the row for longer than the server's 1 s wait) is run
// again, and succeeds once the lock is released, instead of failing the
// processor's write.
func TestFinishRetriesALockWaitTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := gomysql.ParseDSN(b.DSN)
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
	st, err := mysql.New(db, optionsOf(b))
	if err != nil {
		t.Fatal(err)
	}
	id := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0)
	got := seedtest.Claim(t, st, 10, seedtest.T0)
	if len(got) != 1 || got[0].ID != id {
		t.Fatalf("claimed %v, want %s", seedtest.IDs(got), id)
	}
	ctx := context.Background()
	lock, err := b.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback() }()
	if _, err := lock.Exec(`SELECT id FROM `+b.Table("EVENT")+` WHERE id = ? FOR UPDATE`, id); err != nil {
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
		{Kind: outbox.OutcomeSent, Topic: got[0].Topic, ID: id, Attempt: got[0].Attempts, ClaimToken: got[0].ClaimToken},
	}})
	if err != nil || len(res.LeaseLost) != 0 {
		t.Fatalf("MessageFinish while the row was locked for 1.5 s: %+v, %v", res, err)
	}
	if r := b.Row(t, "EVENT", id); r.Status != "COMPLETED" {
		t.Fatalf("row %+v, want COMPLETED", r)
	}
}

func TestClaimKeepsFIFOPerGroup(t *testing.T) {
	t.Parallel()
	seedtest.ClaimKeepsFIFOPerGroup(t, setup)
}

func TestFinishOutcomes(t *testing.T) { t.Parallel(); seedtest.FinishOutcomes(t, setup) }

func TestFinishIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	seedtest.FinishIsFencedByTheLease(t, setup)
}

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

func TestIDsSharedAcrossTablesKeepTheirOwnOutcome(t *testing.T) {
	t.Parallel()
	seedtest.IDsSharedAcrossTablesKeepTheirOwnOutcome(t, setup)
}

// Rows written within one second (TIMESTAMP has whole seconds on MySQL)
// keep their order by id, also with two claimers.
func TestClaimOrdersRowsOfOneSecondByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []string
	for i := range 6 {
		want = append(want, b.Insert(t, "EVENT", "G", fmt.Sprintf(`{"n":%d}`, i), seedtest.T0))
	}
	// Another claimer holds the group's first rows (locked, not yet
	// committed): this claim must not take the rows after them.
	ctx := context.Background()
	tx, err := b.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec(`SELECT id FROM `+b.Table("EVENT")+` WHERE id IN (?, ?) FOR UPDATE`, want[0], want[1]); err != nil {
		t.Fatal(err)
	}
	if got := seedtest.Claim(t, b.Store, 10, seedtest.T0); len(got) != 0 {
		t.Fatalf("claimed %v while the group's head is locked by another claimer", seedtest.IDs(got))
	}
	_ = tx.Rollback()
	got := seedtest.IDs(seedtest.Claim(t, b.Store, 4, seedtest.T0))
	if strings.Join(got, ",") != strings.Join(want[:4], ",") {
		t.Fatalf("claimed %v, want %v", got, want[:4])
	}
}

func TestRecover(t *testing.T) {
	t.Parallel()
	for _, counts := range []bool{false, true} {
		t.Run(fmt.Sprint("RecoveryCountsAttempt=", counts), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			st, err := mysql.New(b.DB, mysql.Options{EventsTable: optionsOf(b).EventsTable, DispatchJobsTable: optionsOf(b).DispatchJobsTable, RecoveryCountsAttempt: counts})
			if err != nil {
				t.Fatal(err)
			}
			stuck := b.Insert(t, "EVENT", "G", `{}`, seedtest.T0)
			last := b.Insert(t, "DISPATCH_JOB", "", `{}`, seedtest.T0)
			fresh := b.Insert(t, "EVENT", "", `{}`, seedtest.T0)
			set := `UPDATE %s SET status = 'PROCESSING', retry_count = ?, processed_at = NOW() - INTERVAL ? MINUTE WHERE id = ?`
			b.Exec(t, fmt.Sprintf(set, b.Table("EVENT")), 0, 10, stuck)
			b.Exec(t, fmt.Sprintf(set, b.Table("DISPATCH_JOB")), 3, 10, last)
			b.Exec(t, fmt.Sprintf(set, b.Table("EVENT")), 0, 1, fresh)
			now := time.Now().Add(24 * time.Hour)
			res, err := st.MessageRecover(context.Background(), outbox.MessageRecoverParams{ClaimedBefore: now.Add(-5 * time.Minute), Now: now, MaxAttempts: 4})
			want := outbox.RecoverResult{Recovered: 2}
			if counts {
				want = outbox.RecoverResult{Recovered: 1, DeadLettered: 1}
			}
			if err != nil || res != want {
				t.Fatalf("recover: %+v, %v, want %+v", res, err, want)
			}
			r := b.Row(t, "EVENT", stuck)
			if r.Status != "PENDING" || r.ProcessedAt.Valid || (r.RetryCount == 1) != counts {
				t.Errorf("stuck row %+v, want PENDING, processed_at NULL, retry_count counted: %v", r, counts)
			}
			r = b.Row(t, "DISPATCH_JOB", last)
			if counts && (r.Status != "FAILED" || !strings.HasPrefix(r.Error.String, "lease_expired: ")) {
				t.Errorf("row on its last attempt %+v, want FAILED lease_expired", r)
			}
			if !counts && (r.Status != "PENDING" || r.RetryCount != 3) {
				t.Errorf("row on its last attempt %+v, want PENDING with retry_count 3", r)
			}
			if r := b.Row(t, "EVENT", fresh); r.Status != "PROCESSING" {
				t.Errorf("row within its lease %+v was recovered", r)
			}
		})
	}
}

func TestQueriesAndCreateTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	st, err := mysql.New(b.DB, mysql.Options{EventsTable: b.Schema + ".ev2", DispatchJobsTable: b.Schema + ".jobs2"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.CreateTables(ctx); err != nil {
			t.Fatalf("CreateTables: %v", err)
		}
	}
	ids, err := st.Insert(ctx, b.DB, mysql.Item{Topic: "EVENT", Group: "g", Payload: []byte(`{"a":1}`)},
		mysql.Item{Topic: "DISPATCH_JOB", Payload: []byte(`{"b":2}`)})
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
	if _, err := mysql.DSN("not a dsn"); err == nil {
		t.Error("DSN accepted a malformed DSN")
	}
}

func TestReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	seedtest.ReclaimBeforeForget(t, setup)
}

func TestProcessorReclaimBeforeForgetKeepsTheNewLease(t *testing.T) {
	t.Parallel()
	seedtest.ProcessorReclaimBeforeForget(t, setup)
}
