package postgres

// ElectorLockKeys returns the two keys of e's session advisory lock, for the
// tests that look for its holder in pg_locks.
func ElectorLockKeys(e *Elector) (ns, key int32) { return e.nsKey, e.key }
