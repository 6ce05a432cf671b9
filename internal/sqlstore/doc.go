// Package sqlstore is the database/sql code store/mysql and store/sqlite
// share: listing, counting, attempts, operator transitions, receipts,
// pruning, lease recovery, the inbox prune, the migration runner and the
// scan helpers. A Dialect holds what truly differs between the two
// databases (how times are stored, row locking, the bounded delete, how a
// migration file is executed); each store keeps what differs in substance:
// its claim, its outcome batch (finish), its insert, and its transactions.
//
// A store embeds *Store (through an unexported alias), so the shared methods
// are part of the store's own method set, and passes its transaction and
// insert functions in Config.
package sqlstore
