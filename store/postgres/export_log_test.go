package postgres

// EnableLogMode switches s to the append-only path (logmode.go), for the
// tests of that path while it is built.
func EnableLogMode(s *Store) { s.enableLogMode() }
