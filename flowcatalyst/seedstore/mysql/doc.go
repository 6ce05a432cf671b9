// Package mysql is an outbox.Store over seed 004's outbox tables
// (outbox_events and outbox_dispatch_jobs, the FlowCatalyst outbox
// processor's) in MySQL 8 or MariaDB 10.6+, exactly as the seed defines
// them and as applications in any language write them, so that outboxkit's
// processor can replace the seed's. Package seedstore (the parent
// directory) gives the schema and how a row maps to an outbox.Message;
// packages postgres and mongo beside this one are the same Store on
// PostgreSQL and MongoDB.
//
//	dsn, err := mysql.DSN("user:pass@tcp(host:3306)/app")
//	db, err := sql.Open("mysql", dsn) // github.com/go-sql-driver/mysql
//	store, err := mysql.New(db, mysql.Options{})
//
// The behaviour is the PostgreSQL Store's (FIFO per message_group, NULL as
// the group "default", outcomes fenced by the claim, the database's NOW()),
// with these differences that follow from MySQL:
//
//   - a claim is one READ COMMITTED transaction of several statements (see
//     MessageClaim), as is a finish; both are run again after a deadlock
//     or a lock wait timeout;
//   - a group's order is (created_at, id): TIMESTAMP has whole seconds on
//     MySQL, so rows of one second are ordered by id (TSIDs follow
//     creation);
//   - the seed's TIMESTAMP has whole seconds on MySQL, so processed_at
//     (the claim fence and the retry time) is kept to the second: a
//     processing timeout must be at least a second, and a retry delay is
//     rounded to the second by the server;
//   - message_group compares with the column's collation (usually
//     case-insensitive): groups that the collation deems equal are
//     claimed as one FIFO group (ordered together, never reordered);
//   - statements that change rows also set created_at to itself, so a
//     created_at column declared with ON UPDATE CURRENT_TIMESTAMP (what
//     MySQL gives the seed's DDL when explicit_defaults_for_timestamp is
//     off) keeps its value, and with it the group's order.
//
// # Files
//
// store.go holds New, Options and DSN; enqueue.go Insert and
// MessageEnqueue; claim.go MessageClaim; finish.go MessageFinish and
// MessageRecover; retry.go the retry after a deadlock; query.go the reads,
// requeue and prune; migrate.go CreateTables; sql.go every statement, one
// named constant each.
package mysql
