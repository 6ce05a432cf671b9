package seedstore

import "time"

// SetMongoClaimBudget sets the time budget of s's claims (a Store from
// NewMongo), before s is used.
func SetMongoClaimBudget(s *Store, d time.Duration) { s.mg.budget = d }
