package postgres

// EnableLogMode switches s to the append-only path (logmode.go), for the
// tests of that path while it is built.
func EnableLogMode(s *Store) { s.enableLogMode() }

// LogClaimLock is the advisory lock (namespace, key) a claim on the
// append-only path try-locks for an ordered group.
func LogClaimLock(s *Store, tenant, topic, grp string) (int32, string) {
	return s.groupNS + logClaimLockKey, tenant + "\x1f" + topic + "\x1f" + grp + "\x1f0"
}
