-- outboxkit store/postgres schema, version 1.
-- The schema and table-prefix placeholders are replaced by Options.Schema and
-- Options.TablePrefix (validated identifiers).

CREATE TABLE {{schema}}.{{prefix}}messages (
    id                  text        NOT NULL,
    seq                 bigint      GENERATED ALWAYS AS IDENTITY,
    tenant              text        NOT NULL,
    topic               text        NOT NULL,
    grp                 text        NOT NULL DEFAULT '',
    idempotency_key     text        NOT NULL,
    status              text        NOT NULL,
    attempts            integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    claimed_at          timestamptz,
    claimed_by          text,
    provider_message_id text,
    last_error_code     text,
    last_error_message  text,
    sent_at             timestamptz,
    delivered_at        timestamptz,
    read_at             timestamptz,
    headers             jsonb,
    -- json (not jsonb) keeps the caller's bytes exactly (signatures, key order).
    payload             json        NOT NULL,
    CONSTRAINT {{prefix}}messages_pkey PRIMARY KEY (id),
    CONSTRAINT {{prefix}}messages_idempotency UNIQUE (tenant, idempotency_key),
    CONSTRAINT {{prefix}}messages_status_check CHECK (status IN ('PENDING', 'PROCESSING', 'SENT', 'DELIVERED', 'FAILED', 'CANCELLED'))
) WITH (
    -- Every status change is a non-HOT update (status is in index
    -- predicates); leave room so the new version usually lands on the same
    -- page, and vacuum early and often: a queue table churns.
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- Listing and pagination per tenant.
CREATE INDEX {{prefix}}messages_tenant_seq ON {{schema}}.{{prefix}}messages (tenant, seq);

-- Claim path, ordered messages: the scan window of pending messages in
-- sequence order ...
CREATE INDEX {{prefix}}messages_claim_ordered ON {{schema}}.{{prefix}}messages (seq)
    WHERE status = 'PENDING' AND grp <> '';
-- ... and the active (unfinished) messages of each group, to find a group's
-- head and its run.
CREATE INDEX {{prefix}}messages_group_active ON {{schema}}.{{prefix}}messages (tenant, topic, grp, seq)
    WHERE status IN ('PENDING', 'PROCESSING') AND grp <> '';

-- Claim path, unordered messages: due ones by due time.
CREATE INDEX {{prefix}}messages_claim_unordered ON {{schema}}.{{prefix}}messages (next_attempt_at)
    WHERE status = 'PENDING' AND grp = '';

-- Lease recovery.
CREATE INDEX {{prefix}}messages_processing ON {{schema}}.{{prefix}}messages (claimed_at)
    WHERE status = 'PROCESSING';

-- Receipts by provider message ID, tenant-scoped.
CREATE INDEX {{prefix}}messages_provider ON {{schema}}.{{prefix}}messages (tenant, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Pruning finished messages.
CREATE INDEX {{prefix}}messages_finished ON {{schema}}.{{prefix}}messages (updated_at)
    WHERE status IN ('SENT', 'DELIVERED', 'FAILED', 'CANCELLED');

CREATE TABLE {{schema}}.{{prefix}}attempts (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    message_id        text        NOT NULL,
    tenant            text        NOT NULL,
    number            integer     NOT NULL,
    outcome           text        NOT NULL,
    error_code        text,
    error_message     text,
    provider_response json,
    next_attempt_at   timestamptz,
    started_at        timestamptz,
    finished_at       timestamptz NOT NULL,
    CONSTRAINT {{prefix}}attempts_pkey PRIMARY KEY (id)
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE INDEX {{prefix}}attempts_message ON {{schema}}.{{prefix}}attempts (message_id, id);
