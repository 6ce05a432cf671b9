-- Append-only group progress (issue #28): a claim and the outcome of a run
-- insert one row each here instead of updating every message twice, so the
-- hot path leaves no dead row versions for a held cleanup horizon to keep.
-- A group's state is its latest mark (by mseq). part is 0 for a group; an
-- unordered message (grp '') is a group of its own, part = its seq.
--   done:  every message of the group up to seq done is finished.
--   lease: (done, upto] is claimed by owner under token since at (a run of
--          which the messages up to done are finished already).
-- A message row stays PENDING when its group's marks finish it; its
-- status column keeps the rare states (a retry's attempts and due time, a
-- dead letter, a cancel, a sent message with a provider ID, receipts).
CREATE TABLE {{schema}}.{{prefix}}marks (
    mseq   bigint      GENERATED ALWAYS AS IDENTITY,
    tenant text        COLLATE "C" NOT NULL,
    topic  text        COLLATE "C" NOT NULL,
    grp    text        COLLATE "C" NOT NULL,
    part   bigint      NOT NULL DEFAULT 0,
    kind   text        NOT NULL,
    done   bigint      NOT NULL,
    upto   bigint      NOT NULL,
    token  uuid,
    owner  text,
    at     timestamptz NOT NULL,
    CONSTRAINT {{prefix}}marks_pkey PRIMARY KEY (mseq),
    CONSTRAINT {{prefix}}marks_kind_check CHECK (kind IN ('done', 'lease'))
) WITH (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
-- A group's latest mark: one backward descent, however many came before.
CREATE INDEX {{prefix}}marks_latest ON {{schema}}.{{prefix}}marks (tenant, topic, grp, part, mseq);
-- When a message was finished: the group's first mark whose done reaches
-- it (done never goes down within a group).
CREATE INDEX {{prefix}}marks_done ON {{schema}}.{{prefix}}marks (tenant, topic, grp, part, done, mseq);
-- Leases by claim time, for lease recovery.
CREATE INDEX {{prefix}}marks_lease ON {{schema}}.{{prefix}}marks (at) WHERE kind = 'lease';

-- Every ordered group ever enqueued to: what the claim's backstop probes
-- for a message its windows passed (a late commit).
CREATE TABLE {{schema}}.{{prefix}}groups (
    tenant text COLLATE "C" NOT NULL,
    topic  text COLLATE "C" NOT NULL,
    grp    text COLLATE "C" NOT NULL,
    CONSTRAINT {{prefix}}groups_pkey PRIMARY KEY (tenant, topic, grp)
);
INSERT INTO {{schema}}.{{prefix}}groups
SELECT DISTINCT tenant, topic, grp FROM {{schema}}.{{prefix}}messages WHERE grp <> '';

-- The log window: the messages whose rows are PENDING, by sequence number.
-- Partial on a predicate only the append-only path's statements state
-- (claimed_by IS NULL: that path never sets it), so the other statements'
-- plans keep their indexes.
CREATE INDEX {{prefix}}messages_pending_seq ON {{schema}}.{{prefix}}messages (seq)
    WHERE status = 'PENDING' AND claimed_by IS NULL;
-- Messages that wait for a time of their own (a retry, a deferred release,
-- a scheduled enqueue): the claim finds their groups again when they come
-- due.
CREATE INDEX {{prefix}}messages_due ON {{schema}}.{{prefix}}messages (next_attempt_at)
    WHERE status = 'PENDING' AND next_attempt_at > created_at AND claimed_by IS NULL;

-- Every message with the state its group's marks give it: a PENDING row
-- at or below its group's done is SENT (at the first mark that reached
-- it), one inside its group's live lease is PROCESSING (claimed by the
-- lease's owner, at its time, under its token, with the attempt counted).
-- Every other row is as stored.
CREATE VIEW {{schema}}.{{prefix}}message_state AS
SELECT m.id, m.seq, m.tenant, m.topic, m.grp, m.idempotency_key,
    CASE x.eff WHEN 1 THEN 'SENT' WHEN 2 THEN 'PROCESSING' ELSE m.status END AS status,
    m.attempts + CASE WHEN x.eff > 0 THEN 1 ELSE 0 END AS attempts,
    m.max_attempts, m.next_attempt_at, m.created_at,
    CASE x.eff WHEN 1 THEN f.at WHEN 2 THEN k.at ELSE m.updated_at END AS updated_at,
    CASE x.eff WHEN 1 THEN NULL WHEN 2 THEN k.at ELSE m.claimed_at END AS claimed_at,
    CASE x.eff WHEN 1 THEN NULL WHEN 2 THEN k.owner ELSE m.claimed_by END AS claimed_by,
    m.provider_message_id, m.last_error_code, m.last_error_message,
    CASE x.eff WHEN 1 THEN f.at ELSE m.sent_at END AS sent_at,
    m.delivered_at, m.read_at, m.headers, m.payload, m.sent_response, m.sent_started_at,
    CASE x.eff WHEN 1 THEN f.at ELSE m.sent_finished_at END AS sent_finished_at,
    m.blocks_group, m.content_type, m.payload_bytes, m.recoveries,
    CASE x.eff WHEN 1 THEN NULL WHEN 2 THEN k.token ELSE m.claim_token END AS claim_token
FROM {{schema}}.{{prefix}}messages m
LEFT JOIN LATERAL (
    SELECT k.kind, k.done, k.upto, k.token, k.owner, k.at FROM {{schema}}.{{prefix}}marks k
    WHERE m.status = 'PENDING' AND k.tenant = m.tenant AND k.topic = m.topic AND k.grp = m.grp
        AND k.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END
    ORDER BY k.tenant, k.topic, k.grp, k.part, k.mseq DESC LIMIT 1) k ON true
CROSS JOIN LATERAL (SELECT CASE WHEN m.seq <= k.done THEN 1
    WHEN k.kind = 'lease' AND m.seq <= k.upto THEN 2 ELSE 0 END AS eff) x
LEFT JOIN LATERAL (
    SELECT f.at FROM {{schema}}.{{prefix}}marks f
    WHERE x.eff = 1 AND f.tenant = m.tenant AND f.topic = m.topic AND f.grp = m.grp
        AND f.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END AND f.done >= m.seq
    ORDER BY f.tenant, f.topic, f.grp, f.part, f.done, f.mseq LIMIT 1) f ON true;
