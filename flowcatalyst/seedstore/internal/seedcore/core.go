// Package seedcore is what the three stores over seed 004's tables
// (flowcatalyst/seedstore/postgres, mysql and mongo) share and no database
// driver is needed for: the settings and their defaults, the leases a Store
// remembers for the rows it claimed, the mapping of a seed row to an
// outbox.Message, the validation of items and outcomes, and the claim's
// turn between the two tables. Each store does its own I/O.
package seedcore

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/outbox"
)

// Default table names, as in seed 004.
const (
	DefaultEventsTable       = "outbox_events"
	DefaultDispatchJobsTable = "outbox_dispatch_jobs"
)

// DefaultNullGroup is the group of rows whose message_group is NULL, as in
// the seed.
const DefaultNullGroup = "default"

// Seed statuses.
const (
	StatusPending    = "PENDING"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Options are the settings every store has; each store's own Options
// documents them.
type Options struct {
	EventsTable           string
	DispatchJobsTable     string
	Logger                *slog.Logger
	UnorderedNullGroup    bool
	RecoveryCountsAttempt bool
	MaxClaimPerGroup      int
}

// Table names one of the two tables: its topic, its name as configured
// and the Options field that names it (for errors).
type Table struct{ Topic, Name, Field string }

// Core is the state a Store keeps beside its database handle: settings,
// the leases of the rows it claimed, the tables' turn. It is safe for
// concurrent use.
type Core struct {
	// Log defaults to discarding.
	Log *slog.Logger
	// UnorderedNull: Options.UnorderedNullGroup.
	UnorderedNull bool
	// RecoveryCounts: Options.RecoveryCountsAttempt.
	RecoveryCounts bool
	// Chunk is the most rows of one group claimed at once.
	Chunk int
	// BeforeForget, tests only: runs between a finish's commit and its
	// forget. Set before the Store is used.
	BeforeForget func()

	tables []Table // events, dispatch jobs
	wake   chan struct{}

	mu          sync.Mutex
	leases      map[leaseKey]lease
	leaseGen    uint64    // the last lease.gen handed out
	turn        int       // which table claims first
	lastCreated time.Time // ItemsOf: the latest created_at written
}

// New applies the defaults to opts (in place) and returns the Core of a
// Store with those settings.
func New(opts *Options) (*Core, error) {
	if opts.EventsTable == "" {
		opts.EventsTable = DefaultEventsTable
	}
	if opts.DispatchJobsTable == "" {
		opts.DispatchJobsTable = DefaultDispatchJobsTable
	}
	if strings.EqualFold(opts.EventsTable, opts.DispatchJobsTable) {
		return nil, outbox.InvalidParam("Options.DispatchJobsTable", "must differ from EventsTable")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxClaimPerGroup < 0 || opts.MaxClaimPerGroup > outbox.MaxClaimLimit {
		return nil, outbox.InvalidParam("Options.MaxClaimPerGroup", fmt.Sprintf("must be between 0 (default) and %d", outbox.MaxClaimLimit))
	}
	if opts.MaxClaimPerGroup == 0 {
		opts.MaxClaimPerGroup = outbox.MaxClaimLimit
	}
	return &Core{
		Log: opts.Logger, UnorderedNull: opts.UnorderedNullGroup, RecoveryCounts: opts.RecoveryCountsAttempt,
		Chunk: opts.MaxClaimPerGroup, wake: make(chan struct{}, 1), leases: map[leaseKey]lease{},
		tables: []Table{
			{flowcatalyst.TopicEvent, opts.EventsTable, "Options.EventsTable"},
			{flowcatalyst.TopicDispatchJob, opts.DispatchJobsTable, "Options.DispatchJobsTable"},
		},
	}, nil
}

// Tables returns the two tables: events, then dispatch jobs.
func (c *Core) Tables() []Table { return c.tables }

// Topics returns the topics of the two tables.
func (c *Core) Topics() []string { return []string{c.tables[0].Topic, c.tables[1].Topic} }

// TableName returns the name of topic's table as configured.
func (c *Core) TableName(topic string) string {
	for _, t := range c.tables {
		if t.Topic == topic {
			return t.Name
		}
	}
	return ""
}

// HasTopic reports whether topic is one of the two tables'.
func (c *Core) HasTopic(topic string) bool {
	return topic == c.tables[0].Topic || topic == c.tables[1].Topic
}

// topicsFor returns the topics of the tables a claim for topics works on
// (both when topics is empty), in table order.
func (c *Core) topicsFor(topics []string) ([]string, error) {
	if len(topics) == 0 {
		return c.Topics(), nil
	}
	var out []string
	for _, t := range c.tables {
		for _, want := range topics {
			if want == "" {
				return nil, outbox.InvalidParam("Topics", "contains an empty topic")
			}
			if want == t.Topic {
				out = append(out, t.Topic)
				break
			}
		}
	}
	return out, nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// QuoteIdent returns name (table or schema.table) quoted with quote, or
// an error when it is not a table name the SQL stores accept.
func QuoteIdent(name, quote string) (string, error) {
	if !identRE.MatchString(name) {
		return "", fmt.Errorf("%q is not a table name (letters, digits and _, optionally schema.table)", name)
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = quote + p + quote
	}
	return strings.Join(parts, "."), nil
}

// CheckTableName returns an error matching outbox.ErrInvalidInput when
// name is not a table name the SQL stores accept.
func CheckTableName(name string) error {
	if _, err := QuoteIdent(name, `"`); err != nil {
		return outbox.InvalidParam("table", err.Error())
	}
	return nil
}

// IndexName is the name of the seed's index on table (possibly
// schema-qualified): idx_<table>_status.
func IndexName(table string) string {
	if i := strings.LastIndex(table, "."); i >= 0 {
		return "idx_" + table[i+1:] + "_status"
	}
	return "idx_" + table + "_status"
}

// At returns t as the stores write it: UTC, truncated to the microsecond
// (TIMESTAMP's precision on PostgreSQL), so a fence compares equal; the
// zero time is now.
func At(t time.Time) time.Time {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// Wakeups returns a channel that receives when a claim stopped early with
// rows left to try (WakeUp); it is closed when done is.
func (c *Core) Wakeups(done <-chan struct{}) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		for {
			select {
			case <-done:
				return
			case <-c.wake:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// WakeUp signals Wakeups without blocking.
func (c *Core) WakeUp() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}
