package outbox

import (
	"context"
	"time"
)

// StorageReporter is an optional Store capability: it reports what the
// store's tables cost the database to keep clean. A queue table churns
// (every message is inserted, updated and removed), so the dead row versions
// it leaves and anything that stops the database from removing them (a
// transaction left open, a stale replication slot) are the first things to
// watch when claims slow down. The OpenTelemetry gauges (outbox/otel) and
// the admin API (outbox/admin) use it when the store has it;
// store/postgres implements it.
type StorageReporter interface {
	StorageStats(ctx context.Context) (StorageStats, error)
}

// StorageStats is a store's storage report.
type StorageStats struct {
	// Tables has one entry per table of the store, ordered by name.
	Tables []TableStorage
	// Horizon is what holds back the removal of dead row versions across
	// the whole database, not only the store's tables.
	Horizon CleanupHorizon
}

// TableStorage is one table's row counts, as the database's statistics
// estimate them.
type TableStorage struct {
	// Name is the table's qualified name.
	Name string
	// LiveRows and DeadRows estimate the table's live rows and its dead row
	// versions (updated or deleted, not yet removed by a cleanup).
	LiveRows, DeadRows int64
	// LastCleanup is when a cleanup of the table (PostgreSQL: VACUUM,
	// manual or automatic) last ended; zero when none is known.
	LastCleanup time.Time
}

// CleanupHorizon is the oldest thing that keeps dead row versions from
// being removed: on PostgreSQL, the oldest transaction ID a session's
// snapshot or open transaction, a replication slot or a prepared
// transaction still needs.
type CleanupHorizon struct {
	// AgeTransactions is how many transactions ago it started: dead rows
	// of every table made since then stay until it ends. 0 when nothing
	// holds one.
	AgeTransactions int64
	// Holder describes it for an operator (a session's process ID, state,
	// application name and transaction start; a slot's name; a prepared
	// transaction's global ID); "" when nothing holds one.
	Holder string
}
