package mongo

// ElectorLeaseID returns the _id of e's lease document, for the tests.
func ElectorLeaseID(e *Elector) string { return e.id }
