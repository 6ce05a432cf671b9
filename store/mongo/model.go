package mongo

import (
	"encoding/json"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// msgDoc is a message as stored in the messages collection.
type msgDoc struct {
	ID     string `bson:"_id"`
	Seq    int64  `bson:"seq"`
	Tenant string `bson:"tenant"`
	Topic  string `bson:"topic"`
	Group  string `bson:"grp"`
	GKey   string `bson:"gkey"` // "" for unordered, else lenKey(tenant, topic, group)
	Key    string `bson:"key"`
	// Payload holds a JSON payload as a string (as before content types);
	// PayloadBin holds any other payload as BSON binary, byte for byte.
	Payload     string            `bson:"payload"`
	PayloadBin  []byte            `bson:"payload_bin,omitempty"`
	ContentType string            `bson:"ct,omitempty"`
	Headers     map[string]string `bson:"headers,omitempty"`
	MaxAttempts int               `bson:"max_attempts"`
	Status      string            `bson:"status"`
	// Fin is true in SENT, DELIVERED, FAILED and CANCELLED, except on a
	// dead letter that blocks its group (Blocks): the claim reads a group's
	// open documents (fin false) and stops at one that is not PENDING, so
	// such a dead letter holds its group as a waiting retry does, and
	// prune (fin true) keeps it.
	Fin         bool       `bson:"fin"`
	Blocks      bool       `bson:"blocks_group,omitempty"`
	Attempts    int        `bson:"attempts"`
	Recoveries  int        `bson:"recoveries,omitempty"` // lease recoveries (see MessageRecover)
	NextAt      time.Time  `bson:"next_at"`
	ProvID      string     `bson:"prov_id,omitempty"`
	LastError   *errDoc    `bson:"last_error,omitempty"`
	CreatedAt   time.Time  `bson:"created_at"`
	UpdatedAt   time.Time  `bson:"updated_at"`
	ClaimedAt   *time.Time `bson:"claimed_at,omitempty"`
	ClaimedBy   string     `bson:"claimed_by,omitempty"`
	SentAt      *time.Time `bson:"sent_at,omitempty"`
	DeliveredAt *time.Time `bson:"delivered_at,omitempty"`
	ReadAt      *time.Time `bson:"read_at,omitempty"`
	// Op and FinishOp are the tokens of the last claim and the last
	// outcome that wrote the document: a bulk write reads them back to
	// learn which of its updates applied. Op, new for each claim, is also
	// the message's ClaimToken while it is PROCESSING (it stays on the
	// document afterwards, where the fence, which wants PROCESSING, no
	// longer matches it).
	Op       string `bson:"op,omitempty"`
	FinishOp string `bson:"fop,omitempty"`
}

type errDoc struct {
	Code    string `bson:"code"`
	Message string `bson:"message"`
}

// attemptDoc is one row of the attempt history.
type attemptDoc struct {
	MsgID      string     `bson:"msg_id"`
	Tenant     string     `bson:"tenant"`
	N          int        `bson:"n"`
	Outcome    string     `bson:"outcome"`
	Error      *errDoc    `bson:"error,omitempty"`
	Response   string     `bson:"resp,omitempty"`
	NextAt     *time.Time `bson:"next_at,omitempty"`
	StartedAt  time.Time  `bson:"started_at"`
	FinishedAt time.Time  `bson:"finished_at"`
}

func finished(st outbox.Status) bool {
	switch st {
	case outbox.StatusSent, outbox.StatusDelivered, outbox.StatusFailed, outbox.StatusCancelled:
		return true
	}
	return false
}

func groupKey(m *outbox.Message) string {
	if m.Group == "" {
		return ""
	}
	return lenKey(m.Tenant, m.Topic, m.Group)
}

func tp(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func tv(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func errOf(e *outbox.ErrorInfo) *errDoc {
	if e == nil {
		return nil
	}
	return &errDoc{Code: e.Code, Message: e.Message}
}

func (e *errDoc) info() *outbox.ErrorInfo {
	if e == nil {
		return nil
	}
	return &outbox.ErrorInfo{Code: e.Code, Message: e.Message}
}

func newDoc(m *outbox.Message, seq int64) msgDoc {
	d := msgDoc{
		ID: m.ID, Seq: seq, Tenant: m.Tenant, Topic: m.Topic, Group: m.Group, GKey: groupKey(m),
		Key: m.IdempotencyKey, Headers: m.Headers, MaxAttempts: m.MaxAttempts, ContentType: m.ContentType,
		Status: string(outbox.StatusPending), NextAt: m.NextAttemptAt.UTC(),
		CreatedAt: m.CreatedAt.UTC(), UpdatedAt: m.UpdatedAt.UTC(),
	}
	if m.IsJSON() {
		d.Payload = string(m.Payload)
	} else {
		d.PayloadBin = m.Payload
	}
	return d
}

func (d *msgDoc) message() outbox.Message {
	m := outbox.Message{
		ID: d.ID, Tenant: d.Tenant, Topic: d.Topic, Group: d.Group, IdempotencyKey: d.Key,
		ContentType: d.ContentType, MaxAttempts: d.MaxAttempts, NextAttemptAt: d.NextAt.UTC(),
		Seq: d.Seq, Status: outbox.Status(d.Status), Attempts: d.Attempts, ProviderMessageID: d.ProvID,
		LastError: d.LastError.info(), CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC(),
		ClaimedAt: tv(d.ClaimedAt), ClaimedBy: d.ClaimedBy,
		SentAt: tv(d.SentAt), DeliveredAt: tv(d.DeliveredAt), ReadAt: tv(d.ReadAt), BlocksGroup: d.Blocks,
	}
	if m.Status == outbox.StatusProcessing {
		m.ClaimToken = d.Op
	}
	if m.IsJSON() {
		m.Payload = []byte(d.Payload)
	} else {
		m.Payload = append([]byte{}, d.PayloadBin...)
	}
	if len(d.Headers) > 0 {
		m.Headers = d.Headers
	}
	return m
}

func (a *attemptDoc) attempt() outbox.Attempt {
	out := outbox.Attempt{
		MessageID: a.MsgID, Tenant: a.Tenant, Number: a.N, Outcome: outbox.AttemptOutcome(a.Outcome),
		Error: a.Error.info(), NextAttemptAt: tv(a.NextAt), StartedAt: a.StartedAt.UTC(), FinishedAt: a.FinishedAt.UTC(),
	}
	if a.Response != "" {
		out.ProviderResponse = json.RawMessage(a.Response)
	}
	return out
}
