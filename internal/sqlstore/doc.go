// Package sqlstore is the database/sql code store/mysql and store/sqlite
// share: enqueueing, listing, counting, attempts, operator transitions,
// receipts, pruning, lease recovery and extension, the inbox, the admin
// queries, the migration runner and the scan helpers.
//
// Each store holds a *Store and gives each of its exported methods a method
// of its own that calls it, so godoc shows a store's methods (and their
// documentation) on the store's own type. What differs between the two
// databases comes in two parts: a Syntax holds what differs in SQL text
// and arguments (how times are stored, row locking, the bounded delete,
// how a migration file is executed), and a Dialect is what each store does
// in substance its own way: its transactions, its migration lock, its
// insert, its claim and its batch of outcomes. Store calls the Dialect after
// it has validated and stamped a call; a Dialect uses this package's
// helpers but never calls back into Store.
package sqlstore
