-- outboxkit store/postgres schema, version 2: the consumer inbox
-- (outbox.Inbox). The schema and table-prefix placeholders are replaced by Options.Schema
-- and Options.TablePrefix (validated identifiers).

CREATE TABLE {{schema}}.{{prefix}}inbox (
    consumer   text        NOT NULL,
    tenant     text        NOT NULL,
    message_id text        NOT NULL,
    handled_at timestamptz NOT NULL,
    CONSTRAINT {{prefix}}inbox_pkey PRIMARY KEY (consumer, tenant, message_id)
);

-- Prune: records by age.
CREATE INDEX {{prefix}}inbox_handled ON {{schema}}.{{prefix}}inbox (handled_at);
