-- outboxkit store/mysql schema, version 2: the consumer inbox
-- (outbox.Inbox). {{prefix}} is replaced by Options.TablePrefix. Keys are
-- VARBINARY (byte for byte, as in version 1); handled_at is DATETIME(6)
-- holding UTC. Idempotent (IF NOT EXISTS), like every migration here.

CREATE TABLE IF NOT EXISTS {{prefix}}inbox (
    consumer   VARBINARY(255) NOT NULL,
    tenant     VARBINARY(255) NOT NULL DEFAULT '',
    message_id VARBINARY(255) NOT NULL,
    handled_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, tenant, message_id),
    -- Prune: records by age.
    KEY {{prefix}}inbox_handled (handled_at)
) ENGINE = InnoDB;
