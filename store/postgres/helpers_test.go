package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/testbackend"
	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/postgres"
)

type bundle struct {
	t     *testing.T
	ctx   context.Context
	pg    testbackend.PostgresSchema
	store *postgres.Store
	ob    *outbox.Outbox[pgx.Tx]
}

// setup returns a migrated store in a fresh schema.
func setup(t *testing.T, opts ...func(*postgres.Options)) *bundle {
	t.Helper()
	pg := testbackend.Postgres(t, 16)
	o := postgres.Options{Schema: pg.Name}
	for _, f := range opts {
		f(&o)
	}
	s, err := postgres.New(pg.Pool, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, ctx: ctx, pg: pg, store: s, ob: outbox.New[pgx.Tx](s, outbox.Options{})}
}

func msg(topic, group string, n int) outbox.Message {
	return outbox.Message{Topic: topic, Group: group, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// enqueue enqueues msgs in one committed transaction.
func (b *bundle) enqueue(msgs ...outbox.Message) []outbox.Enqueued {
	b.t.Helper()
	res, err := b.ob.Enqueue(b.ctx, msgs...)
	if err != nil {
		b.t.Fatal(err)
	}
	return res
}

// wantPending fails the test unless n messages are PENDING.
func (b *bundle) wantPending(n int64) {
	b.t.Helper()
	cnt, err := b.store.MessageCount(b.ctx, outbox.MessageCountParams{})
	if err != nil || cnt[outbox.StatusPending] != n {
		b.t.Fatalf("count = %v, %v, want %d pending", cnt, err, n)
	}
}

func (b *bundle) claim(owner string, limit int) []outbox.Message {
	b.t.Helper()
	ms, err := b.store.MessageClaim(b.ctx, outbox.MessageClaimParams{Limit: limit, Owner: owner, Now: time.Now()})
	if err != nil {
		b.t.Fatal(err)
	}
	return ms
}

func (b *bundle) sent(owner string, ms ...outbox.Message) {
	b.t.Helper()
	p := outbox.MessageFinishParams{Owner: owner, Now: time.Now()}
	for _, m := range ms {
		p.Outcomes = append(p.Outcomes, outbox.Outcome{Kind: outbox.OutcomeSent, ID: m.ID, Attempt: m.Attempts, ClaimToken: m.ClaimToken, ProviderMessageID: "p-" + m.ID})
	}
	res, err := b.store.MessageFinish(b.ctx, p)
	if err != nil {
		b.t.Fatal(err)
	}
	if len(res.LeaseLost) > 0 {
		b.t.Fatalf("lease lost: %v", res.LeaseLost)
	}
}

func payloadN(t testing.TB, m outbox.Message) int {
	t.Helper()
	var v struct{ N int }
	if err := json.Unmarshal(m.Payload, &v); err != nil {
		t.Fatal(err)
	}
	return v.N
}

func ids(ms []outbox.Message) []string {
	out := make([]string, len(ms))
	for i := range ms {
		out[i] = ms[i].ID
	}
	return out
}
