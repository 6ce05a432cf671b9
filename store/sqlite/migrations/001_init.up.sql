-- outboxkit SQLite schema, version 1. {{prefix}} is replaced by Options.TablePrefix.
-- Times are integer Unix microseconds (UTC); NULL means "not yet".

CREATE TABLE {{prefix}}messages (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    id                  TEXT    NOT NULL UNIQUE,
    tenant              TEXT    NOT NULL DEFAULT '',
    topic               TEXT    NOT NULL,
    grp                 TEXT    NOT NULL DEFAULT '',
    idempotency_key     TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    headers             TEXT,
    status              TEXT    NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     INTEGER NOT NULL,
    provider_message_id TEXT,
    last_error_code     TEXT,
    last_error_message  TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    claimed_at          INTEGER,
    claimed_by          TEXT,
    sent_at             INTEGER,
    delivered_at        INTEGER,
    read_at             INTEGER,
    UNIQUE (tenant, idempotency_key)
);

-- Claim: due unordered (grp '') PENDING messages in sequence order.
CREATE INDEX {{prefix}}messages_unordered_idx
    ON {{prefix}}messages (seq, next_attempt_at, topic) WHERE status = 'PENDING' AND grp = '';

-- Claim: the open (PENDING or PROCESSING) messages of each group in order;
-- the claim walks the groups through it (one seek per group) and reads the
-- claimable prefix of each.
CREATE INDEX {{prefix}}messages_open_group_idx
    ON {{prefix}}messages (tenant, topic, grp, seq) WHERE status IN ('PENDING', 'PROCESSING');

-- Recovery: expired leases.
CREATE INDEX {{prefix}}messages_processing_idx
    ON {{prefix}}messages (claimed_at) WHERE status = 'PROCESSING';

-- Receipts: lookup by provider message ID within a tenant.
CREATE INDEX {{prefix}}messages_provider_idx
    ON {{prefix}}messages (tenant, provider_message_id) WHERE provider_message_id IS NOT NULL;

-- Listing and counting within a tenant.
CREATE INDEX {{prefix}}messages_tenant_seq_idx
    ON {{prefix}}messages (tenant, seq);
CREATE INDEX {{prefix}}messages_tenant_status_idx
    ON {{prefix}}messages (tenant, status, seq);

-- Prune: finished messages by age.
CREATE INDEX {{prefix}}messages_updated_idx
    ON {{prefix}}messages (updated_at) WHERE status IN ('SENT', 'DELIVERED', 'FAILED', 'CANCELLED');

CREATE TABLE {{prefix}}attempts (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id        TEXT    NOT NULL REFERENCES {{prefix}}messages (id) ON DELETE CASCADE,
    tenant            TEXT    NOT NULL DEFAULT '',
    number            INTEGER NOT NULL,
    outcome           TEXT    NOT NULL,
    error_code        TEXT,
    error_message     TEXT,
    provider_response TEXT,
    next_attempt_at   INTEGER,
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER NOT NULL
);

CREATE INDEX {{prefix}}attempts_message_idx
    ON {{prefix}}attempts (message_id, id);
