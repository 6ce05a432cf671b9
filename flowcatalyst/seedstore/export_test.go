package seedstore

import "time"

// SetMongoClaimBudget sets the time budget of s's claims (a Store from
// NewMongo), before s is used.
func SetMongoClaimBudget(s *Store, d time.Duration) { s.mg.budget = d }

// SetBeforeForget makes f run between each finish's commit and the moment
// it forgets the leases it used, before s is used.
func SetBeforeForget(s *Store, f func()) { s.beforeForget = f }
