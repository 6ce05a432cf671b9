package admin

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// FleetReporter is what the console shows of a fleet running in the
// host's process (Config.Fleet): *outbox.Fleet implements it.
type FleetReporter interface {
	// Status is this instance's view: its members, its share and the
	// databases it serves.
	Status() outbox.FleetStatus
	// Leases are every database's lease, whoever holds it.
	Leases(ctx context.Context) ([]outbox.ShardLease, error)
	// Backlogs count what waits in the databases this instance serves.
	Backlogs(ctx context.Context) []outbox.ShardBacklog
}

// Shard states in GET api/fleet.
const (
	// ShardServing: this instance runs the database's processor and its
	// last store call succeeded.
	ShardServing = "serving"
	// ShardUnhealthy: this instance runs the processor, and its store
	// calls fail.
	ShardUnhealthy = "unhealthy"
	// ShardStarting: this instance holds the lease and its processor has
	// not started yet.
	ShardStarting = "starting"
	// ShardFailing: this instance holds the lease and cannot open the
	// store or start the processor; it retries with backoff.
	ShardFailing = "failing"
	// ShardStopping: this instance is stopping the processor (the lease is
	// handed over, lost, or the fleet stops).
	ShardStopping = "stopping"
	// ShardElsewhere: another instance holds a live lease.
	ShardElsewhere = "elsewhere"
	// ShardUnserved: listed, and no instance holds a live lease: nothing
	// publishes the database's messages until one takes it.
	ShardUnserved = "unserved"
	// ShardUnlisted: a lease of a database the last listing no longer
	// has.
	ShardUnlisted = "unlisted"
	// ShardUnknown: another instance's database, when the leases could
	// not be read (LeaseError says why).
	ShardUnknown = "unknown"
)

// FleetShard is one database in GET api/fleet. The lease fields come from
// the coordination store; the processor's (Local true) from this
// instance.
type FleetShard struct {
	Database string `json:"database"`
	// State is one of the Shard* constants.
	State string `json:"state"`
	// Listed reports that the last listing has the database.
	Listed bool `json:"listed"`
	// Owner is the member that holds the live lease; "" when none does.
	// LastOwner is the member that held it last (live or not).
	Owner     string `json:"owner,omitempty"`
	LastOwner string `json:"last_owner,omitempty"`
	// Epoch counts the lease's acquisitions (outbox.ShardLease).
	Epoch int64 `json:"epoch,omitempty"`
	// LeaseExpiresAt is when the live lease runs out unless renewed.
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// Local reports a database this instance serves: the fields below are
	// known.
	Local      bool       `json:"local"`
	Healthy    bool       `json:"healthy"`
	AcquiredAt *time.Time `json:"acquired_at,omitempty"`
	RenewedAt  *time.Time `json:"renewed_at,omitempty"`
	// Error is the kind of the last error (opening the store, starting or
	// running the processor), not its text: a driver's error may carry a
	// DSN. HealthSince is when the processor last changed health.
	Error               string     `json:"error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures,omitempty"`
	HealthSince         *time.Time `json:"health_since,omitempty"`
	InFlight            int64      `json:"in_flight"`
	Claimed             int64      `json:"claimed"`
	Sent                int64      `json:"sent"`
	Retried             int64      `json:"retried"`
	DeadLettered        int64      `json:"dead_lettered"`
	Released            int64      `json:"released"`
	StoreCalls          int64      `json:"store_calls"`
	// Backlog is set when asked for (backlog=true) and the store counted:
	// the PENDING messages due now, and the age of the oldest.
	Backlog *Backlog `json:"backlog,omitempty"`
}

// Backlog is what waits in one database.
type Backlog struct {
	Pending             int64      `json:"pending"`
	OldestDueAt         *time.Time `json:"oldest_due_at,omitempty"`
	OldestDueAgeSeconds float64    `json:"oldest_due_age_seconds"`
	Error               string     `json:"error,omitempty"`
}

// Fleet is the answer of GET api/fleet: the fleet's databases as this
// instance and the coordination store see them.
type Fleet struct {
	// Instance is this instance's ID; Members the live instances.
	Instance string   `json:"instance"`
	Members  []string `json:"members"`
	// Databases is how many the last listing has; Target is this
	// instance's share; Serving how many it serves.
	Databases int `json:"databases"`
	Target    int `json:"target"`
	Serving   int `json:"serving"`
	// Unserved counts the listed databases no instance holds (0 when the
	// leases could not be read).
	Unserved int `json:"unserved"`
	// LeaseTTLSeconds is the fleet's lease period.
	LeaseTTLSeconds float64 `json:"lease_ttl_seconds"`
	// ListError and LeaseError are the kinds of the last failure listing
	// the databases and of the coordination store (this instance's, or
	// reading the leases for this answer); "" when they work.
	ListError  string       `json:"list_error,omitempty"`
	LeaseError string       `json:"lease_error,omitempty"`
	Shards     []FleetShard `json:"shards"`
	Now        time.Time    `json:"now"`
}

// errorKind names what failed without the error's text.
func errorKind(err error, what string) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, outbox.ErrNotMigrated):
		return what + ": the store is not migrated"
	case errors.Is(err, outbox.ErrStoreUnavailable):
		return what + ": the store is unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return what + ": timed out"
	}
	return what + " failed"
}

// fleet answers GET api/fleet[?backlog=true].
func (h *Handler) fleet(w http.ResponseWriter, r *http.Request) {
	if !onlyParams(w, r, "backlog") {
		return
	}
	withBacklog := false
	switch r.URL.Query().Get("backlog") {
	case "", "false":
	case "true":
		withBacklog = true
	default:
		h.fail(w, r, outbox.InvalidParam("backlog", "must be true or false"))
		return
	}
	if h.cfg.Fleet == nil {
		writeError(w, http.StatusNotFound, "no fleet is configured (Config.Fleet)")
		return
	}
	writeJSON(w, http.StatusOK, h.fleetView(r.Context(), withBacklog))
}

func (h *Handler) fleetView(ctx context.Context, withBacklog bool) Fleet {
	now := h.cfg.Clock.Now()
	st := h.cfg.Fleet.Status()
	out := Fleet{
		Instance: st.ID, Members: st.Members, Databases: st.Databases, Target: st.Target,
		LeaseTTLSeconds: st.LeaseTTL.Seconds(), Shards: []FleetShard{}, Now: now,
		ListError:  errorKind(st.ListErr, "listing the databases"),
		LeaseError: errorKind(st.LeaseErr, "the coordination store"),
	}
	if out.Members == nil {
		out.Members = []string{}
	}
	leases, err := h.cfg.Fleet.Leases(ctx)
	if err != nil {
		h.cfg.Logger.WarnContext(ctx, "outbox admin: reading the fleet's leases failed", "err", err)
		out.LeaseError = errorKind(err, "reading the leases")
	}
	byName := map[string]*FleetShard{}
	get := func(name string) *FleetShard {
		s := byName[name]
		if s == nil {
			s = &FleetShard{Database: name}
			byName[name] = s
		}
		return s
	}
	for _, name := range st.Listed {
		get(name).Listed = true
	}
	for _, l := range leases {
		s := get(l.Shard)
		s.LastOwner, s.Epoch = l.Owner, l.Epoch
		if !l.Expired {
			s.Owner = l.Owner
			s.LeaseExpiresAt = optTime(l.ExpiresAt)
		}
	}
	for _, sh := range st.Shards {
		s := get(sh.Database)
		s.Local = true
		s.AcquiredAt, s.RenewedAt = optTime(sh.AcquiredAt), optTime(sh.RenewedAt)
		if s.Epoch < sh.Epoch || err != nil {
			// The leases were not read, or are older than this instance's
			// view: this instance's lease is the latest known.
			s.Owner, s.LastOwner, s.Epoch = st.ID, st.ID, sh.Epoch
			s.LeaseExpiresAt = optTime(sh.LeaseExpiresAt)
		}
		hl, pr := sh.Health, sh.Progress
		s.Healthy = hl.Healthy && !sh.Stopping && sh.Err == nil
		s.ConsecutiveFailures, s.HealthSince = hl.ConsecutiveFailures, optTime(hl.Since)
		s.InFlight, s.Claimed, s.Sent, s.Retried, s.DeadLettered, s.Released = pr.InFlight, pr.Claimed, pr.Sent, pr.Retried, pr.DeadLettered, pr.Released
		s.StoreCalls = sh.StoreCalls
		switch {
		case sh.Stopping:
			s.State = ShardStopping
		case sh.Err != nil:
			s.State, s.Error = ShardFailing, errorKind(sh.Err, "opening the store or starting its processor")
		case !hl.Running:
			s.State = ShardStarting
		case hl.Healthy:
			s.State, out.Serving = ShardServing, out.Serving+1
		default:
			s.State, s.Error = ShardUnhealthy, errorKind(hl.Err, "store calls")
		}
	}
	if withBacklog {
		for _, b := range h.cfg.Fleet.Backlogs(ctx) {
			s := byName[b.Database]
			if s == nil {
				continue
			}
			switch {
			case b.Err != nil:
				s.Backlog = &Backlog{Error: errorKind(b.Err, "counting the backlog")}
			case b.Known:
				s.Backlog = &Backlog{Pending: b.Pending, OldestDueAt: optTime(b.OldestDueAt)}
				if !b.OldestDueAt.IsZero() {
					s.Backlog.OldestDueAgeSeconds = max(now.Sub(b.OldestDueAt), 0).Seconds()
				}
			}
		}
	}
	for _, s := range byName {
		if s.State == "" {
			switch {
			case err != nil:
				s.State = ShardUnknown
			case !s.Listed:
				s.State = ShardUnlisted
			case s.Owner != "":
				s.State = ShardElsewhere
			default:
				s.State = ShardUnserved
			}
		}
		if err == nil && s.Listed && s.Owner == "" {
			out.Unserved++
		}
		out.Shards = append(out.Shards, *s)
	}
	slices.SortFunc(out.Shards, func(a, b FleetShard) int { return strings.Compare(a.Database, b.Database) })
	return out
}
