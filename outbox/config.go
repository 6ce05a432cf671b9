package outbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"
)

// Config configures a Processor. The zero value of every field means its
// default; NewProcessor applies defaults (WithDefaults) then validates.
type Config struct {
	// ID names this processor in leases (ClaimedBy) and logs. Defaults to
	// "<hostname>-<random>". Two live processors must not share an ID.
	ID string
	// Topics restricts the processor to these topics. Defaults to the
	// publisher's topics when it has a Topics() []string method (a
	// *Router). A processor never claims every topic by default: with no
	// topics from either source NewProcessor fails unless AllTopics is set.
	Topics []string
	// AllTopics makes the processor claim messages of every topic, of every
	// tenant. It is an explicit choice because a publisher that does not
	// know a topic dead-letters its messages (a Router answers
	// ErrNoPublisher, a permanent error). It cannot be combined with Topics.
	AllTopics bool
	// PollInterval is the longest wait between two claims when nothing wakes
	// the poller earlier. Defaults to 1s.
	PollInterval time.Duration
	// IdlePollInterval is the wait between two claims, when nothing wakes
	// the poller earlier, while the store's wake-ups arrive (a LiveWaker
	// reports them live: LISTEN on PostgreSQL) and the last claim found
	// nothing with nothing in flight: an idle database then costs one
	// claim per IdlePollInterval instead of one per PollInterval. The
	// wake-ups bring what is enqueued, requeued or released; the
	// processor wakes itself when the retries and deferrals it wrote are
	// due (up to 1,024 of them at a time). A message that becomes
	// claimable by time alone otherwise (the application set its
	// NextAttemptAt in the future, or more retries are waiting) is claimed
	// up to IdlePollInterval after it is due. While the wake-ups are not
	// live (the listener connecting or lost, notifications not delivered)
	// the processor polls every PollInterval. Defaults to PollInterval (no
	// change); a Fleet's processors default to RecoveryInterval. Must not
	// be shorter than PollInterval.
	IdlePollInterval time.Duration
	// PollBatchSize is the most messages claimed at once. Defaults to 500.
	PollBatchSize int
	// PublishBatchSize is the most messages handed to one Publish call.
	// Defaults to 100.
	PublishBatchSize int
	// MaxConcurrentGroups is the most groups publishing at the same time.
	// Defaults to 10.
	MaxConcurrentGroups int
	// BufferSize bounds the claimed messages held in memory; the poller
	// claims no more than the free space, so a full buffer leaves messages
	// in the database. Defaults to 1000.
	BufferSize int
	// ProcessingTimeout is the lease: a message PROCESSING for longer is
	// considered abandoned (its processor died) and is recovered. On a store
	// that is a LeaseExtender the processor renews the leases it holds
	// every quarter of ProcessingTimeout, so only a processor that stopped
	// (or lost the store for that long) loses them; on other stores it must
	// exceed the longest publish. Defaults to 5m.
	ProcessingTimeout time.Duration
	// MaxUnrecordedOutcomes bounds the published messages whose outcomes
	// are not written yet: a group worker waits before it publishes while
	// this many wait for the store. A processor that crashes has its
	// messages published again once their leases expire; of those, at most
	// this many plus the batches being published had been published
	// already (duplicates). It also caps a processor's rate at this many
	// messages per outcome write: at 2,000 msg/s the default stops the
	// workers whenever a write takes longer than 50 ms (a slow disk flush),
	// and one processor draining a backlog publishes about 100 messages per
	// round trip. A larger value trades more duplicates after a crash for
	// throughput and a shorter latency tail (see store/postgres's
	// PERFORMANCE.md). Defaults to PublishBatchSize.
	MaxUnrecordedOutcomes int
	// MaxRecoveries is how many times lease recovery puts a message back to
	// PENDING before it dead-letters it instead. Recovery does not count an
	// attempt (the processor that held the message may never have published
	// it), so this bounds a message that makes its processors crash.
	// Defaults to 5.
	MaxRecoveries int
	// RecoveryInterval is how often expired leases are recovered. Defaults
	// to 1m.
	RecoveryInterval time.Duration
	// MaxErrorBackoff caps the wait between two claims while the store keeps
	// failing (unreachable, tables missing): the wait doubles from
	// PollInterval at each consecutive failure up to this. Defaults to 30s.
	MaxErrorBackoff time.Duration
	// UnroutedAfter is how long a topic's messages must have been due,
	// unclaimed, before a processor that does not claim that topic reports
	// it (a periodic warning and Processor.Progress().Unrouted). The check
	// runs every RecoveryInterval on stores that implement
	// PendingTopicLister; a processor with AllTopics does not run it.
	// Defaults to 5m.
	UnroutedAfter time.Duration
	// DrainTimeout is how long Run lets in-flight publishes finish after its
	// context is cancelled before cancelling them. It must be shorter than
	// ProcessingTimeout: a publish that outlived its lease would be
	// recovered and published again by another processor. Defaults to 30s,
	// or half of ProcessingTimeout when that is shorter.
	DrainTimeout time.Duration
	// MaxAttempts is the number of publish attempts of a message whose own
	// MaxAttempts is 0, before it is dead-lettered. Defaults to
	// DefaultMaxAttempts (6: the first attempt and the five retries of
	// DefaultSchedule).
	MaxAttempts int
	// DeadLetter says, per topic, what a dead letter of an ordered group
	// does to the messages behind it: DeadLetterContinue (the group moves
	// on) or DeadLetterBlock (the group waits until the dead letter is
	// requeued or cancelled). Defaults to DeadLetterContinue for every
	// topic. A topic named in DeadLetter.ByTopic must be one this
	// processor claims (Topics, or the publisher's topics), unless
	// AllTopics is set.
	DeadLetter DeadLetterRule
	// Backoff computes retry delays. Defaults to DefaultSchedule, no jitter.
	Backoff Backoff
	// Leader, when set, gates claiming and recovery: a processor that is
	// not the leader idles (single-active mode). Defaults to always active.
	Leader Leader
	// Observer receives attempt hooks. Defaults to none.
	Observer Observer
	// Logger receives structured logs. Defaults to discarding them.
	Logger *slog.Logger
	// Clock stamps claims and computes due times. Defaults to SystemClock.
	Clock Clock
}

// DefaultMaxRecoveries is Config.MaxRecoveries' default.
const DefaultMaxRecoveries = 5

// Leader reports whether this processor may work now (single-active mode).
// Every store of this module offers one, its Elector: a PostgreSQL advisory
// lock, MySQL's GET_LOCK, a MongoDB lease document, or, on SQLite, an
// election within the process.
type Leader interface {
	IsLeader() bool
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		c.ID = defaultID()
	}
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.IdlePollInterval = cmp.Or(c.IdlePollInterval, c.PollInterval)
	c.PollBatchSize = cmp.Or(c.PollBatchSize, 500)
	c.PublishBatchSize = cmp.Or(c.PublishBatchSize, 100)
	c.MaxConcurrentGroups = cmp.Or(c.MaxConcurrentGroups, 10)
	c.BufferSize = cmp.Or(c.BufferSize, 1000)
	c.ProcessingTimeout = cmp.Or(c.ProcessingTimeout, 5*time.Minute)
	c.MaxUnrecordedOutcomes = cmp.Or(c.MaxUnrecordedOutcomes, c.PublishBatchSize)
	c.MaxRecoveries = cmp.Or(c.MaxRecoveries, DefaultMaxRecoveries)
	c.RecoveryInterval = cmp.Or(c.RecoveryInterval, time.Minute)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, min(30*time.Second, c.ProcessingTimeout/2))
	c.MaxErrorBackoff = cmp.Or(c.MaxErrorBackoff, 30*time.Second)
	c.UnroutedAfter = cmp.Or(c.UnroutedAfter, 5*time.Minute)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	if len(c.Backoff.Schedule) == 0 {
		c.Backoff.Schedule = DefaultSchedule
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = SystemClock
	}
	return c
}

// Validate reports the first invalid field of c (after defaults) as a
// *ValidationError.
func (c Config) Validate() error {
	pos := func(name string, v int) error {
		if v < 1 {
			return invalid("Config."+name, fmt.Sprintf("must be positive, got %d", v))
		}
		return nil
	}
	posD := func(name string, v time.Duration) error {
		if v <= 0 {
			return invalid("Config."+name, fmt.Sprintf("must be positive, got %s", v))
		}
		return nil
	}
	for _, err := range []error{
		pos("PollBatchSize", c.PollBatchSize), pos("PublishBatchSize", c.PublishBatchSize),
		pos("MaxConcurrentGroups", c.MaxConcurrentGroups), pos("BufferSize", c.BufferSize),
		pos("MaxAttempts", c.MaxAttempts), pos("MaxUnrecordedOutcomes", c.MaxUnrecordedOutcomes),
		pos("MaxRecoveries", c.MaxRecoveries),
		posD("PollInterval", c.PollInterval), posD("ProcessingTimeout", c.ProcessingTimeout),
		posD("RecoveryInterval", c.RecoveryInterval), posD("DrainTimeout", c.DrainTimeout),
		posD("MaxErrorBackoff", c.MaxErrorBackoff), posD("UnroutedAfter", c.UnroutedAfter),
	} {
		if err != nil {
			return err
		}
	}
	if c.IdlePollInterval < c.PollInterval {
		return invalid("Config.IdlePollInterval", fmt.Sprintf("(%s) must not be shorter than Config.PollInterval (%s)", c.IdlePollInterval, c.PollInterval))
	}
	if c.DrainTimeout >= c.ProcessingTimeout {
		return invalid("Config.DrainTimeout", fmt.Sprintf("(%s) must be shorter than Config.ProcessingTimeout (%s), the lease: "+
			"a publish still draining when its lease expires is published again by another processor", c.DrainTimeout, c.ProcessingTimeout))
	}
	if c.MaxAttempts > MaxAttemptsLimit {
		return invalid("Config.MaxAttempts", fmt.Sprintf("must be at most %d", MaxAttemptsLimit))
	}
	if len(c.ID) > MaxKeyLength {
		return invalid("Config.ID", "is too long")
	}
	for i, d := range c.Backoff.Schedule {
		if d < 0 {
			return invalid("Config.Backoff.Schedule", fmt.Sprintf("entry %d is negative", i))
		}
	}
	if c.Backoff.Jitter < 0 || c.Backoff.Jitter > 1 {
		return invalid("Config.Backoff.Jitter", "must be between 0 and 1")
	}
	for _, t := range c.Topics {
		if strings.TrimSpace(t) == "" {
			return invalid("Config.Topics", "contains an empty topic")
		}
	}
	if c.AllTopics && len(c.Topics) > 0 {
		return invalid("Config.AllTopics", "is set together with Config.Topics: choose one")
	}
	if err := c.DeadLetter.Validate("Config.DeadLetter"); err != nil {
		return err
	}
	if !c.AllTopics && len(c.Topics) > 0 {
		for t := range c.DeadLetter.ByTopic {
			if !slices.Contains(c.Topics, t) {
				return invalid("Config.DeadLetter.ByTopic", fmt.Sprintf("names topic %q, which this processor does not claim (Config.Topics: %v)", t, c.Topics))
			}
		}
	}
	return nil
}

func defaultID() string {
	h, _ := os.Hostname()
	if h == "" {
		h = "processor"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return h + "-" + hex.EncodeToString(b[:])
}
