package mysql

import (
	"testing"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
)

// SetBeforeForget makes f run between each finish's commit and the moment
// it forgets the leases it used, before s is used.
func SetBeforeForget(s *Store, f func()) { s.core.BeforeForget = f }

// TestConstantsAreTheSharedOnes: the constants this package spells out for
// its godoc are the ones the shared code uses.
func TestConstantsAreTheSharedOnes(t *testing.T) {
	for _, c := range [][2]string{
		{DefaultEventsTable, seedcore.DefaultEventsTable}, {DefaultDispatchJobsTable, seedcore.DefaultDispatchJobsTable},
		{DefaultNullGroup, seedcore.DefaultNullGroup}, {StatusPending, seedcore.StatusPending},
		{StatusProcessing, seedcore.StatusProcessing}, {StatusCompleted, seedcore.StatusCompleted}, {StatusFailed, seedcore.StatusFailed},
	} {
		if c[0] != c[1] {
			t.Errorf("%q here, %q in seedcore", c[0], c[1])
		}
	}
}
