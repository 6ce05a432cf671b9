package mongo

import "time"

// SetClaimBudget sets the time budget of s's claims, before s is used.
func SetClaimBudget(s *Store, d time.Duration) { s.budget = d }
