package mysql

// ElectorLockName returns the GET_LOCK name of e's election in database,
// for the tests that look for its holder.
func ElectorLockName(e *Elector, database string) string { return e.lockName(database) }
