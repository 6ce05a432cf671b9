package outbox

import (
	"context"
	"encoding/json"
	"time"
)

// Store is the port the processor, the webhook handlers and operators use.
// Store adapters (store/sqlite, store/postgres, ...) implement it; outside
// implementations are welcome and are held to the conformance suite in
// outbox/outboxtest/storetest. Every method takes one Params struct so fields can be
// added without breaking callers. Methods are scoped by tenant where a
// tenant applies.
//
// Enqueueing is not part of Store: it needs the caller's transaction type, so
// each adapter implements Enqueuer[TTx] and users enqueue through
// Outbox[TTx].
type Store interface {
	// AttemptList returns the attempts of one message, oldest first.
	AttemptList(ctx context.Context, p AttemptListParams) ([]Attempt, error)
	// MessageApplyReceipt applies a provider receipt to the message with
	// that provider message ID in that tenant, with ApplyReceipt's rule. It
	// returns ErrNotFound when no such message exists in the tenant.
	MessageApplyReceipt(ctx context.Context, p MessageApplyReceiptParams) (ReceiptResult, error)
	// MessageCancel moves a PENDING message, or a dead letter (FAILED), to
	// CANCELLED; other statuses return an error wrapping
	// ErrInvalidTransition. Cancelling a dead letter that blocks its group
	// (BlocksGroup) releases the group.
	MessageCancel(ctx context.Context, p MessageCancelParams) (Message, error)
	// MessageClaim atomically leases up to Limit due messages (PENDING,
	// NextAttemptAt <= Now) to Owner: status PROCESSING, Attempts+1,
	// ClaimedAt = Now, and a new ClaimToken (see Message.ClaimToken),
	// returned on each message. It keeps FIFO per group: a message is not claimed
	// while an earlier message of its group (smaller Seq) is PROCESSING,
	// PENDING and not claimed in the same call, or a dead letter that
	// blocks its group (FAILED with BlocksGroup). Results are ordered by
	// Seq.
	MessageClaim(ctx context.Context, p MessageClaimParams) ([]Message, error)
	// MessageCount counts messages by status (every status is present in the
	// map, possibly 0).
	MessageCount(ctx context.Context, p MessageCountParams) (map[Status]int64, error)
	// MessageFinish records the outcomes of publish attempts in one call, one
	// statement per kind where the database allows: sent, retry at a time,
	// dead letter, released without an attempt (see Outcome). Adapters call
	// p.Validate before any write. Each outcome is fenced by the
	// lease (status PROCESSING, ClaimedBy = Owner, Attempts = Attempt,
	// ClaimToken = the outcome's ClaimToken): an outcome whose lease was
	// lost is skipped and its ID returned. The claim token is what tells
	// two claims of a message by the same owner at the same attempt apart
	// (a release or a recovered lease gives the attempt back).
	// Every change out of PROCESSING clears the token.
	MessageFinish(ctx context.Context, p MessageFinishParams) (FinishResult, error)
	// MessageGet returns one message by ID within a tenant, or ErrNotFound.
	MessageGet(ctx context.Context, p MessageGetParams) (Message, error)
	// MessageList returns a page of messages ordered by Seq, filtered by
	// tenant and optionally status, topic and group.
	MessageList(ctx context.Context, p MessageListParams) (MessagePage, error)
	// MessagePrune deletes finished messages (SENT, DELIVERED, FAILED,
	// CANCELLED) last updated before Before, with their attempts, at most
	// Limit per call, and returns how many it deleted. A dead letter that
	// blocks its group is kept: deleting it would release the group
	// unseen. Statuses and Topic narrow what is deleted; DryRun counts it
	// instead.
	MessagePrune(ctx context.Context, p MessagePruneParams) (int, error)
	// MessageRecover puts back to PENDING every PROCESSING message claimed
	// before ClaimedBefore (an expired lease: its processor died), without
	// counting the lost attempt (Attempts goes back down by one: the
	// processor may never have published it), and counts the recovery. The
	// recovery that brings a message's recoveries to MaxRecoveries
	// dead-letters it instead (a message that makes its processors crash),
	// blocking its group when DeadLetter says so. Returns how many were
	// recovered and dead-lettered.
	MessageRecover(ctx context.Context, p MessageRecoverParams) (RecoverResult, error)
	// MessageRequeue moves a FAILED message back to PENDING, due now, with
	// its attempts reset (and BlocksGroup cleared: a dead letter that
	// blocked its group is published before the messages behind it); other
	// statuses return ErrInvalidTransition.
	MessageRequeue(ctx context.Context, p MessageRequeueParams) (Message, error)
}

// Enqueuer is implemented by a store adapter for its transaction type TTx
// (pgx.Tx, *sql.Tx, a Mongo session context, ...). Outbox[TTx] calls it after
// validation and policy checks.
type Enqueuer[TTx any] interface {
	// MessageEnqueue inserts messages in a transaction of its own.
	MessageEnqueue(ctx context.Context, p MessageEnqueueParams) ([]Enqueued, error)
	// MessageEnqueueTx inserts messages in the caller's transaction: they
	// exist if and only if it commits. A repeated (Tenant, IdempotencyKey)
	// returns the stored message with Existed = true and leaves the
	// transaction usable.
	MessageEnqueueTx(ctx context.Context, tx TTx, p MessageEnqueueParams) ([]Enqueued, error)
}

// Pinger is an optional Store capability: Ping reports whether the store
// is reachable (an error matching ErrNotMigrated when its tables are
// missing). Processor.Run's start-up probe calls it instead of listing one
// message, for stores where that listing is not cheap (a MongoDB-compatible
// server that sorts in memory reads the whole collection).
type Pinger interface {
	Ping(ctx context.Context) error
}

// Waker is an optional Store capability: a channel that receives a value
// soon after new messages become claimable (committed), so the processor
// claims them without waiting for its poll interval. The channel is closed
// when ctx ends.
type Waker interface {
	Wakeups(ctx context.Context) <-chan struct{}
}

// LiveWaker is a Waker that tells whether its wake-ups arrive. While they
// do, a processor polls every Config.IdlePollInterval rather than every
// PollInterval when it is idle.
type LiveWaker interface {
	Waker
	// WakeupsLive is Wakeups, with a function that reports whether the
	// channel's wake-ups arrive now: true only while a value follows soon
	// after every commit that enqueues, requeues or releases a message.
	// When it turns false (a listener's connection lost) the channel
	// receives a value, so a processor waiting on it polls again.
	WakeupsLive(ctx context.Context) (<-chan struct{}, func() bool)
}

// AttemptListParams selects the attempts of one message.
type AttemptListParams struct {
	Tenant    string
	MessageID string
}

// MessageApplyReceiptParams carries one receipt.
type MessageApplyReceiptParams struct {
	Receipt Receipt
}

// ReceiptResult is the message after a receipt and whether it changed.
type ReceiptResult struct {
	Message Message
	Changed bool
	// Previous is the status before the receipt.
	Previous Status
}

// MessageCancelParams names the message to cancel.
type MessageCancelParams struct {
	Tenant string
	ID     string
	Now    time.Time
}

// MessageClaimParams describes one claim.
type MessageClaimParams struct {
	// Limit is the maximum number of messages to claim (> 0).
	Limit int
	// Topics restricts the claim to these topics; empty means all.
	Topics []string
	// Owner identifies the processor; it fences the outcomes.
	Owner string
	// Now is the processor's clock: messages with NextAttemptAt <= Now are
	// due.
	Now time.Time
}

// MessageCountParams scopes a count. The zero value counts tenant "" only
// (the tenant of single-tenant services), never every tenant: a
// multi-tenant program that wants totals sets AllTenants.
type MessageCountParams struct {
	// Tenant is the one tenant counted; "" is a tenant like any other.
	Tenant string
	// AllTenants counts across every tenant (operators only); Tenant is
	// then ignored.
	AllTenants bool
}

// MessageEnqueueParams carries messages to insert. A store calls Prepare
// once, at the entry of MessageEnqueue and MessageEnqueueTx, and inserts
// only what it returns: that is where every message is validated and
// completed, whoever called the store. Outbox[TTx] validates its messages
// (the same checks and defaults, then its Policy) before it calls the store, and hands
// over what it prepared with the params, so Prepare does not do it twice.
type MessageEnqueueParams struct {
	Messages []Message
	Now      time.Time
	// MaxPayloadBytes is the payload limit Prepare applies; 0 means
	// DefaultMaxPayloadBytes. Outbox sets it to its
	// Options.MaxPayloadBytes.
	MaxPayloadBytes int

	// prepared is what Outbox prepared for this call: Messages is its
	// slice, made for the call and already through prepareMessage and the
	// Policy. Prepare takes the messages as they are while Messages is
	// still that slice; nil for every other caller.
	prepared *preparedBatch
}

// preparedBatch is the value Outbox hands a store with the params (see
// MessageEnqueueParams.prepared).
type preparedBatch struct {
	msgs []Message
}

// OutcomeKind says what a publish attempt led to, and so what MessageFinish
// does with the message.
type OutcomeKind string

// The kinds of Outcome.
const (
	// OutcomeSent: the publisher accepted the message; it becomes SENT.
	OutcomeSent OutcomeKind = "sent"
	// OutcomeRetry: a retryable failure; the message is PENDING again,
	// due at NextAttemptAt.
	OutcomeRetry OutcomeKind = "retry"
	// OutcomeDead: a permanent failure or the last attempt failed; the
	// message becomes FAILED (a dead letter).
	OutcomeDead OutcomeKind = "dead"
	// OutcomeReleased: the message was claimed but not attempted (or its
	// attempt was deferred); it is PENDING again and the attempt is not
	// counted.
	OutcomeReleased OutcomeKind = "released"
)

// Valid reports whether k is one of the kinds above.
func (k OutcomeKind) Valid() bool {
	switch k {
	case OutcomeSent, OutcomeRetry, OutcomeDead, OutcomeReleased:
		return true
	}
	return false
}

// AttemptOutcome is the outcome recorded in the attempt history for k; ok
// is false for a release, which records no attempt.
func (k OutcomeKind) AttemptOutcome() (a AttemptOutcome, ok bool) {
	switch k {
	case OutcomeSent:
		return AttemptSucceeded, true
	case OutcomeRetry:
		return AttemptRetry, true
	case OutcomeDead:
		return AttemptFailed, true
	}
	return "", false
}

// Outcome is the result of one claimed message, as the processor hands it
// to MessageFinish. Which fields apply depends on Kind; Validate refuses a
// field the kind does not record, so nothing is silently dropped:
//
//	Kind      NextAttemptAt          Error                    ProviderMessageID, ProviderResponse, StartedAt
//	sent      -                      -                        recorded
//	retry     due time (zero: Now)   required                 ProviderResponse, StartedAt recorded
//	dead      -                      required                 ProviderResponse, StartedAt recorded
//	released  deferral (zero: keep)  optional, with deferral  -
//
// BlockGroup applies to a dead letter only.
//
// Every outcome names its message by ID and carries its Topic: stores
// whose ids are unique only per topic (e.g. one table per topic) match
// outcomes by (Topic, ID); the others may ignore Topic.
type Outcome struct {
	Kind  OutcomeKind
	Topic string
	ID    string
	// Attempt is the message's Attempts when it was claimed: it fences
	// the outcome to that lease.
	Attempt int
	// ClaimToken is the message's ClaimToken when it was claimed: it
	// fences the outcome to that claim, and so keeps a late outcome of an
	// earlier claim (a write retried after its commit, an outcome written
	// after its lease was recovered) off a later claim by the same owner
	// at the same attempt. "" matches only a lease without a token (one
	// taken before the store issued tokens).
	ClaimToken string
	// NextAttemptAt is when a retried message is due again (zero: at
	// once), or the new due time of a deferred release (zero: a plain
	// release, which keeps the message's due time).
	NextAttemptAt time.Time
	// ProviderMessageID is the provider's ID of a sent message.
	ProviderMessageID string
	// ProviderResponse is recorded in the attempt history.
	ProviderResponse json.RawMessage
	// Error is why a retried or dead message failed, or why a release was
	// deferred (stored as LastError).
	Error *ErrorInfo
	// StartedAt is when the attempt started (zero: the finish's Now).
	StartedAt time.Time
	// BlockGroup makes a dead letter hold its group (DeadLetterBlock): it
	// is stored with Message.BlocksGroup, and the later messages of its
	// (tenant, topic, group) are not claimed until it is requeued or
	// cancelled. Stores ignore it for a message of group "" (no group to
	// hold). A store that cannot hold groups (not a DeadLetterBlocker)
	// refuses it.
	BlockGroup bool
}

// MessageFinishParams carries a batch of outcomes of one owner.
type MessageFinishParams struct {
	Owner    string
	Now      time.Time
	Outcomes []Outcome
}

// FinishResult lists the outcomes that were not applied because the lease
// was lost (recovered and maybe claimed by another processor).
type FinishResult struct {
	LeaseLost []string
}

// MessageGetParams names one message.
type MessageGetParams struct {
	Tenant string
	ID     string
}

// MessageListParams filters and pages a listing.
type MessageListParams struct {
	Tenant string
	// Optional filters; zero values mean any.
	Status Status
	Topic  string
	Group  string
	// BlocksGroup, when true, lists only the dead letters that block their
	// group (Message.BlocksGroup): the groups an operator must requeue or
	// cancel to release.
	BlocksGroup bool
	// AfterSeq continues a listing: pass the previous page's NextAfterSeq.
	AfterSeq int64
	// Limit defaults to 100, at most 1000.
	Limit int
}

// MessagePage is one page of a listing.
type MessagePage struct {
	Messages []Message
	// NextAfterSeq is the AfterSeq of the next page; 0 when this is the last.
	NextAfterSeq int64
}

// MessagePruneParams selects what to prune.
type MessagePruneParams struct {
	// Before: finished messages last updated before this time are deleted.
	Before time.Time
	// Limit caps the rows deleted by one call (keeps locks short);
	// defaults to 1000.
	Limit int
	// Statuses restricts the prune to these finished statuses; empty means
	// every finished status (SENT, DELIVERED, FAILED, CANCELLED). An
	// operator who keeps dead letters for inspection leaves FAILED out.
	Statuses []Status
	// Topic restricts the prune to one topic; "" means every topic.
	Topic string
	// DryRun counts every message the prune would delete (Limit aside)
	// and deletes nothing.
	DryRun bool
}

// PruneStatuses returns the statuses p prunes: p.Statuses, or every
// finished status when it is empty.
func (p MessagePruneParams) PruneStatuses() []Status {
	if len(p.Statuses) > 0 {
		return p.Statuses
	}
	return []Status{StatusSent, StatusDelivered, StatusFailed, StatusCancelled}
}

// MessageRecoverParams selects expired leases.
type MessageRecoverParams struct {
	// ClaimedBefore: PROCESSING messages claimed before this are recovered.
	ClaimedBefore time.Time
	Now           time.Time
	// MaxRecoveries is how many recoveries dead-letter a message (the
	// processor passes Config.MaxRecoveries); 0 means
	// DefaultMaxRecoveries.
	MaxRecoveries int
	// MaxAttempts is used, for messages whose MaxAttempts is 0, by stores
	// that count a recovered lease as an attempt (flowcatalyst/seedstore
	// with Options.RecoveryCountsAttempt); the stores of this module do
	// not.
	MaxAttempts int
	// DeadLetter says which of the messages dead-lettered here block their
	// group (see DeadLetterRule.Blocks). The zero value blocks none.
	DeadLetter DeadLetterRule
}

// RecoverResult counts what recovery did.
type RecoverResult struct {
	Recovered    int
	DeadLettered int
}

// MessageRequeueParams names the dead letter to requeue.
type MessageRequeueParams struct {
	Tenant string
	ID     string
	Now    time.Time
}

// Publisher publishes a batch of messages. It returns exactly one Result per
// message, in the same order: a batch may partly fail. Messages of an ordered
// group arrive in group order; a publisher that sends them one by one should
// stop at the first failure and return ErrNotAttempted for the rest, so FIFO
// holds. Publish must honour ctx: when it ends, return promptly. A message
// the publisher never started to send should carry ErrNotAttempted (it may be
// joined with ctx.Err()): it goes back to PENDING without an attempt counted.
// A message whose send was interrupted should carry ctx.Err(): it counts as a
// retryable attempt, since the provider may have received it.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []Result
}

// PublisherFunc adapts a function to Publisher.
type PublisherFunc func(ctx context.Context, msgs []Message) []Result

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) []Result { return f(ctx, msgs) }

// Result is the outcome of publishing one message.
type Result struct {
	// ProviderMessageID is the provider's ID for the message (a wamid, ...).
	ProviderMessageID string
	// ProviderResponse is recorded in the attempt history (JSON, optional).
	ProviderResponse json.RawMessage
	// Err is nil on success; otherwise a *PublishError (see Permanent,
	// Retryable, RetryAfter), ErrNotAttempted, or any error (retryable).
	Err error
}

// Policy is checked at enqueue for every message. A non-nil *PolicyError (or
// any error) refuses the message: Enqueue returns an error matching
// ErrBlockedByPolicy, nothing is inserted, and observers get
// OnBlockedByPolicy.
type Policy interface {
	Check(ctx context.Context, m *Message) error
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(ctx context.Context, m *Message) error

// Check calls f.
func (f PolicyFunc) Check(ctx context.Context, m *Message) error { return f(ctx, m) }

// Clock tells the time. Tests inject a fake one.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now().UTC() }

// SystemClock is the real clock (UTC).
var SystemClock Clock = systemClock{}
