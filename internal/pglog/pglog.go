// Package pglog lets this module's benchmark switch a store/postgres
// Store to the append-only path (issue #28) while that path is built and
// is not yet an option of the store.
package pglog

// Enable switches its argument, a *postgres.Store, to the append-only
// path. store/postgres sets it when it is linked in.
var Enable func(store any)
