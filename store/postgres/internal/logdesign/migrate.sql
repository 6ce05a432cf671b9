-- The append-only design's tables beside today's messages table (which
-- becomes the log: its rows are no longer updated on the hot path), filled
-- from every message's state. {{schema}} is the store's schema.

-- A group's progress: its latest mark is its state. part is 0 for a group;
-- an unordered message (grp '') is a group of its own, part = its seq.
CREATE TABLE {{schema}}.{{prefix}}marks (
    mseq        bigint      GENERATED ALWAYS AS IDENTITY,
    tenant      text        COLLATE "C" NOT NULL,
    topic       text        COLLATE "C" NOT NULL,
    grp         text        COLLATE "C" NOT NULL,
    part        bigint      NOT NULL DEFAULT 0,
    -- done: every message up to done is finished. lease: (done, upto] is
    -- claimed under token by owner since at. retry: the first message
    -- after done waits until not_before. blocked: it is a dead letter that
    -- holds the group.
    kind        text        NOT NULL CHECK (kind IN ('done', 'lease', 'retry', 'blocked')),
    done        bigint      NOT NULL,
    upto        bigint      NOT NULL,
    token       bigint      NOT NULL DEFAULT 0,
    owner       text,
    not_before  timestamptz,
    attempts    integer     NOT NULL DEFAULT 0,
    recoveries  integer     NOT NULL DEFAULT 0,
    at          timestamptz NOT NULL
);
CREATE INDEX {{prefix}}marks_latest ON {{schema}}.{{prefix}}marks (tenant, topic, grp, part, mseq);

-- Every group ever enqueued to: the backstop's and the console's list.
CREATE TABLE {{schema}}.{{prefix}}groups (
    tenant text COLLATE "C" NOT NULL,
    topic  text COLLATE "C" NOT NULL,
    grp    text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, topic, grp)
);

-- Messages finished otherwise than sent.
CREATE TABLE {{schema}}.{{prefix}}finished (
    seq           bigint      PRIMARY KEY,
    status        text        NOT NULL CHECK (status IN ('FAILED', 'CANCELLED')),
    blocks_group  boolean     NOT NULL DEFAULT false,
    error_code    text,
    error_message text,
    at            timestamptz NOT NULL
);

-- Sent messages with a provider message ID (receipts find them by it).
CREATE TABLE {{schema}}.{{prefix}}sent (
    seq                 bigint      PRIMARY KEY,
    tenant              text        COLLATE "C" NOT NULL,
    provider_message_id text        COLLATE "C" NOT NULL,
    sent_at             timestamptz,
    response            json
);
CREATE INDEX {{prefix}}sent_provider ON {{schema}}.{{prefix}}sent (tenant, provider_message_id);

-- Delivery receipts: a message's status is the highest present.
CREATE TABLE {{schema}}.{{prefix}}receipts (
    seq    bigint      NOT NULL,
    status text        NOT NULL CHECK (status IN ('DELIVERED', 'READ')),
    at     timestamptz NOT NULL,
    PRIMARY KEY (seq, status)
);

INSERT INTO {{schema}}.{{prefix}}groups
SELECT DISTINCT tenant, topic, grp FROM {{schema}}.{{prefix}}messages WHERE grp <> '';

-- An ordered group's state is set by its first open message: the first
-- that is PENDING, PROCESSING or a dead letter holding the group. Every
-- message before it is finished (done); a PROCESSING run from it is a
-- lease (kept with its claim time: the processors of the old version are
-- stopped by the version check, so the lease expires and is recovered); a
-- PENDING one is a retry mark with its due time and attempts; a holding
-- dead letter is a blocked mark. A group with none open is done at its
-- last message.
WITH g AS (
    SELECT tenant, topic, grp, max(seq) AS last,
        min(seq) FILTER (WHERE status IN ('PENDING', 'PROCESSING') OR blocks_group) AS first_open,
        max(seq) FILTER (WHERE status = 'PROCESSING') AS last_leased
    FROM {{schema}}.{{prefix}}messages WHERE grp <> '' GROUP BY tenant, topic, grp),
h AS (
    SELECT g.*, m.status, m.attempts, m.next_attempt_at, m.claimed_by, m.claimed_at, m.blocks_group, m.recoveries
    FROM g LEFT JOIN {{schema}}.{{prefix}}messages m ON m.seq = g.first_open)
INSERT INTO {{schema}}.{{prefix}}marks (tenant, topic, grp, part, kind, done, upto, owner, not_before, attempts, recoveries, at)
SELECT tenant, topic, grp, 0,
    CASE WHEN first_open IS NULL THEN 'done' WHEN status = 'PROCESSING' THEN 'lease'
        WHEN blocks_group THEN 'blocked' ELSE 'retry' END,
    coalesce(first_open - 1, last),
    CASE WHEN status = 'PROCESSING' THEN last_leased ELSE coalesce(first_open - 1, last) END,
    claimed_by,
    CASE WHEN status = 'PENDING' THEN next_attempt_at END,
    coalesce(attempts, 0), coalesce(recoveries, 0), coalesce(claimed_at, now())
FROM h;

-- An unordered message is its own group: finished is done at itself,
-- PROCESSING a lease of itself, PENDING a retry mark with its due time.
INSERT INTO {{schema}}.{{prefix}}marks (tenant, topic, grp, part, kind, done, upto, owner, not_before, attempts, recoveries, at)
SELECT tenant, topic, '', seq,
    CASE status WHEN 'PROCESSING' THEN 'lease' WHEN 'PENDING' THEN 'retry' ELSE 'done' END,
    CASE WHEN status IN ('PROCESSING', 'PENDING') THEN seq - 1 ELSE seq END,
    seq, claimed_by,
    CASE WHEN status = 'PENDING' THEN next_attempt_at END,
    attempts, recoveries, coalesce(claimed_at, updated_at)
FROM {{schema}}.{{prefix}}messages WHERE grp = '';

INSERT INTO {{schema}}.{{prefix}}finished (seq, status, blocks_group, error_code, error_message, at)
SELECT seq, status, blocks_group, last_error_code, last_error_message, updated_at
FROM {{schema}}.{{prefix}}messages WHERE status IN ('FAILED', 'CANCELLED');

INSERT INTO {{schema}}.{{prefix}}sent (seq, tenant, provider_message_id, sent_at, response)
SELECT seq, tenant, provider_message_id, sent_at, sent_response
FROM {{schema}}.{{prefix}}messages WHERE provider_message_id IS NOT NULL;

INSERT INTO {{schema}}.{{prefix}}receipts (seq, status, at)
SELECT seq, 'DELIVERED', delivered_at FROM {{schema}}.{{prefix}}messages WHERE delivered_at IS NOT NULL
UNION ALL
SELECT seq, 'READ', read_at FROM {{schema}}.{{prefix}}messages WHERE read_at IS NOT NULL;

-- A message's state, derived: a finished row wins; below its group's done
-- it is sent (delivered with a receipt); inside its group's live lease it
-- is PROCESSING; else PENDING, with the retry mark's attempts and due time
-- when it is its group's first open message.
CREATE VIEW {{schema}}.{{prefix}}message_state AS
SELECT m.seq, m.id, m.tenant, m.topic, m.grp,
    CASE WHEN f.status IS NOT NULL THEN f.status
        WHEN m.seq <= k.done THEN CASE WHEN EXISTS (SELECT 1 FROM {{schema}}.{{prefix}}receipts r WHERE r.seq = m.seq) THEN 'DELIVERED' ELSE 'SENT' END
        WHEN k.kind = 'lease' AND m.seq <= k.upto THEN 'PROCESSING'
        ELSE 'PENDING' END AS status,
    coalesce(f.blocks_group, false) AS blocks_group,
    CASE WHEN f.status IS NULL AND m.seq > k.done AND k.kind = 'retry'
        AND NOT EXISTS (SELECT 1 FROM {{schema}}.{{prefix}}messages e
            LEFT JOIN {{schema}}.{{prefix}}finished ef ON ef.seq = e.seq
            WHERE m.grp <> '' AND e.tenant = m.tenant AND e.topic = m.topic AND e.grp = m.grp
              AND e.seq > k.done AND e.seq < m.seq AND ef.seq IS NULL)
        THEN k.attempts ELSE 0 END AS head_attempts,
    s.provider_message_id
FROM {{schema}}.{{prefix}}messages m
LEFT JOIN {{schema}}.{{prefix}}finished f ON f.seq = m.seq
LEFT JOIN {{schema}}.{{prefix}}sent s ON s.seq = m.seq
LEFT JOIN LATERAL (
    SELECT kind, done, upto, attempts FROM {{schema}}.{{prefix}}marks k
    WHERE k.tenant = m.tenant AND k.topic = m.topic AND k.grp = m.grp
      AND k.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END
    ORDER BY mseq DESC LIMIT 1) k ON true;
