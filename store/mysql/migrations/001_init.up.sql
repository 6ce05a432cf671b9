-- outboxkit store/mysql schema, version 1 (MySQL 8, MariaDB 10.6+).
-- {{prefix}} is replaced by Options.TablePrefix (a validated identifier).
-- Keys (ids, tenants, topics, groups, idempotency keys) are VARBINARY: they
-- compare byte for byte (no case folding, no trailing-space padding), as
-- the other stores compare them. Times are DATETIME(6) holding UTC.
-- Every statement is idempotent (IF NOT EXISTS), so a migration interrupted
-- half-way can run again.

CREATE TABLE IF NOT EXISTS {{prefix}}messages (
    seq                 BIGINT        NOT NULL AUTO_INCREMENT,
    id                  VARBINARY(255) NOT NULL,
    tenant              VARBINARY(255) NOT NULL DEFAULT '',
    topic               VARBINARY(255) NOT NULL,
    grp                 VARBINARY(255) NOT NULL DEFAULT '',
    idempotency_key     VARBINARY(255) NOT NULL,
    status              VARCHAR(16)   CHARACTER SET ascii NOT NULL,
    attempts            INT           NOT NULL DEFAULT 0,
    max_attempts        INT           NOT NULL DEFAULT 0,
    next_attempt_at     DATETIME(6)   NOT NULL,
    created_at          DATETIME(6)   NOT NULL,
    updated_at          DATETIME(6)   NOT NULL,
    claimed_at          DATETIME(6)   NULL,
    claimed_by          VARBINARY(255) NULL,
    provider_message_id VARBINARY(255) NULL,
    last_error_code     VARCHAR(255)  CHARACTER SET utf8mb4 NULL,
    last_error_message  TEXT          CHARACTER SET utf8mb4 NULL,
    sent_at             DATETIME(6)   NULL,
    delivered_at        DATETIME(6)   NULL,
    read_at             DATETIME(6)   NULL,
    headers             MEDIUMBLOB    NULL,
    -- The caller's JSON bytes, kept exactly.
    payload             MEDIUMBLOB    NOT NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY {{prefix}}messages_id (id),
    UNIQUE KEY {{prefix}}messages_idempotency (tenant, idempotency_key),
    -- Claim: due unordered and ordered PENDING messages in sequence order.
    KEY {{prefix}}messages_claim (status, grp, seq),
    -- Claim: a group's messages in order (its head and run) ...
    KEY {{prefix}}messages_group_seq (tenant, topic, grp, seq),
    -- ... and whether a group has an earlier open message.
    KEY {{prefix}}messages_group_status (tenant, topic, grp, status, seq),
    -- Lease recovery (status PROCESSING) and pruning (finished statuses).
    KEY {{prefix}}messages_status_claimed (status, claimed_at),
    KEY {{prefix}}messages_status_updated (status, updated_at),
    -- Receipts by provider message ID, tenant-scoped.
    KEY {{prefix}}messages_provider (tenant, provider_message_id),
    -- Listing and counting per tenant.
    KEY {{prefix}}messages_tenant_status (tenant, status, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {{prefix}}attempts (
    id                BIGINT        NOT NULL AUTO_INCREMENT,
    message_id        VARBINARY(255) NOT NULL,
    tenant            VARBINARY(255) NOT NULL DEFAULT '',
    number            INT           NOT NULL,
    outcome           VARCHAR(16)   CHARACTER SET ascii NOT NULL,
    error_code        VARCHAR(255)  CHARACTER SET utf8mb4 NULL,
    error_message     TEXT          CHARACTER SET utf8mb4 NULL,
    provider_response MEDIUMBLOB    NULL,
    next_attempt_at   DATETIME(6)   NULL,
    started_at        DATETIME(6)   NOT NULL,
    finished_at       DATETIME(6)   NOT NULL,
    PRIMARY KEY (id),
    KEY {{prefix}}attempts_message (message_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- One row per ordered group ever enqueued into. Enqueue locks the group's
-- row (INSERT ... ON DUPLICATE KEY UPDATE) in the caller's transaction
-- before inserting the message, so a group's enqueues commit one after the
-- other, in sequence order.
CREATE TABLE IF NOT EXISTS {{prefix}}groups (
    tenant VARBINARY(255) NOT NULL,
    topic  VARBINARY(255) NOT NULL,
    grp    VARBINARY(255) NOT NULL,
    PRIMARY KEY (tenant, topic, grp)
) ENGINE = InnoDB;
