// Package seedstore documents the stores over the outbox tables of seed 004
// (the FlowCatalyst outbox processor); the stores themselves are its
// subpackages, one per database, so that a program compiles only the
// driver it uses:
//
//   - flowcatalyst/seedstore/postgres: PostgreSQL (database/sql over pgx);
//   - flowcatalyst/seedstore/mysql: MySQL 8 / MariaDB 10.6+
//     (github.com/go-sql-driver/mysql);
//   - flowcatalyst/seedstore/mongo: MongoDB (mongo-driver/v2), the seed's
//     collections.
//
// Each is an outbox.Store over outbox_events and outbox_dispatch_jobs,
// exactly as the seed defines them and as applications in any language
// write them, so that outboxkit's processor can replace the seed's:
//
//	CREATE TABLE outbox_events (
//	    id VARCHAR(13) PRIMARY KEY,       -- a TSID
//	    type VARCHAR(20) NOT NULL,        -- EVENT or DISPATCH_JOB
//	    message_group VARCHAR(255),       -- FIFO key, NULL = the group "default"
//	    payload TEXT NOT NULL,            -- the JSON item
//	    status VARCHAR(20) NOT NULL,      -- PENDING, PROCESSING, COMPLETED, FAILED
//	    retry_count INT NOT NULL DEFAULT 0,
//	    created_at TIMESTAMP NOT NULL,
//	    processed_at TIMESTAMP,
//	    error_message TEXT
//	);
//
// # Mapping
//
// The table decides the topic: rows of the events table are messages of
// topic flowcatalyst.TopicEvent, rows of the dispatch-jobs table of
// flowcatalyst.TopicDispatchJob. message_group is the group (NULL is the
// group "default", as in the seed; Options.UnorderedNullGroup sends NULL
// rows unordered instead), payload the Payload (sent verbatim; a payload that is
// not JSON fails permanently), created_at the CreatedAt and the order of a
// group (ties broken by id), COMPLETED is outbox's SENT. Every message has
// tenant "". Attempts is retry_count + 1 while a row is PROCESSING.
//
// The seed's columns are used as the seed uses them, plus one convention:
//
//   - processed_at is written from the database's clock (NOW(), in UTC), as
//     in the seed, so processors on hosts with skewed clocks agree;
//   - processed_at of a PROCESSING row is the claim time (the lease); of a
//     COMPLETED or FAILED row the time it finished, as in the seed;
//   - processed_at of a PENDING row, when set, is the time it may be retried
//     (the backoff; the seed's tables have no next-attempt column);
//     applications insert rows with processed_at NULL (due at once). A seed
//     processor running alongside simply ignores the delay;
//   - retry_count counts failed attempts (a retry adds one; a dead letter
//     leaves it, as in the seed; a recovered lease does not, as in the seed,
//     unless Options.RecoveryCountsAttempt); error_message holds the last
//     error as "code: message".
//
// # FIFO
//
// Claims keep FIFO per (table, message_group) with any number of
// processors: a row is claimed only when every earlier unfinished row of
// its group (PENDING, including one waiting for a retry, or PROCESSING) is
// claimed with it. Each store's package says how it does so on its
// database.
//
// # Ids
//
// Ids are unique per table, as in the seed: an event and a dispatch job may
// share one. Outcomes are matched to claims by (table, id). MessageGet,
// MessageRequeue and AttemptList, which take an id alone, look in the
// events table first.
//
// # Limits
//
// The seed tables have no owner column, no attempt history, no receipt and
// no CANCELLED status: AttemptList returns no attempts, MessageApplyReceipt
// returns outbox.ErrNotFound, MessageCancel returns errors.ErrUnsupported.
// Outcomes are fenced by the claim time (processed_at), which the Store
// remembers for the rows it claimed: outcomes must be recorded through the
// Store that claimed (the processor does this). Seq is the id's TSID value
// (0 for an id that is not a TSID); MessageList pages by it.
//
// # Conformance
//
// Each store passes outboxkit's store conformance suite
// (outbox/outboxtest/storetest) with these capabilities declared lacking:
// tenants, idempotency keys, cancel, attempt history, caller-chosen IDs
// longer than 13 characters, receipts, inbox, wake-ups, list-in-tx, admin
// and the caller's clock (times are the database's); its two topics are
// declared in Features.Topics.
package seedstore
