package mysql

// SetBeforeForget makes f run between each finish's commit and the moment
// it forgets the leases it used, before s is used.
func SetBeforeForget(s *Store, f func()) { s.core.BeforeForget = f }
