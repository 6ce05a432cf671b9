-- outboxkit SQLite schema, version 2: the consumer inbox (outbox.Inbox).
-- {{prefix}} is replaced by Options.TablePrefix. handled_at is integer Unix
-- microseconds (UTC).

CREATE TABLE {{prefix}}inbox (
    consumer   TEXT    NOT NULL,
    tenant     TEXT    NOT NULL DEFAULT '',
    message_id TEXT    NOT NULL,
    handled_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, tenant, message_id)
);

-- Prune: records by age.
CREATE INDEX {{prefix}}inbox_handled_idx
    ON {{prefix}}inbox (handled_at);
