-- The marks by a bigint key of their group (issue #28): every claim, take
-- and outcome looks up a group's latest mark, and a descent of an index
-- keyed by three text columns compared them at each level (about a fifth
-- of the server's CPU in a continuous run); an int8 key compares in one
-- instruction and its index tuples have fixed offsets. gk is a 64-bit hash
-- of (tenant, topic, grp): every lookup also compares the three columns,
-- so two groups whose keys collide stay apart.
ALTER TABLE {{schema}}.{{prefix}}marks
    ADD COLUMN gk bigint GENERATED ALWAYS AS (hashtextextended(tenant || chr(31) || topic || chr(31) || grp, 0)) STORED;
-- A group's latest mark: one backward descent.
CREATE INDEX {{prefix}}marks_key_latest ON {{schema}}.{{prefix}}marks (gk, part, mseq);
-- When a message was finished: the group's first mark whose done reaches
-- it.
CREATE INDEX {{prefix}}marks_key_done ON {{schema}}.{{prefix}}marks (gk, part, done, mseq);
DROP INDEX {{schema}}.{{prefix}}marks_latest;
DROP INDEX {{schema}}.{{prefix}}marks_done;

CREATE OR REPLACE VIEW {{schema}}.{{prefix}}message_state AS
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
    WHERE m.status = 'PENDING' AND k.gk = hashtextextended(m.tenant || chr(31) || m.topic || chr(31) || m.grp, 0)
        AND k.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END
        AND k.tenant = m.tenant AND k.topic = m.topic AND k.grp = m.grp
    ORDER BY k.gk, k.part, k.mseq DESC LIMIT 1) k ON true
CROSS JOIN LATERAL (SELECT CASE WHEN m.seq <= k.done THEN 1
    WHEN k.kind = 'lease' AND m.seq <= k.upto THEN 2 ELSE 0 END AS eff) x
LEFT JOIN LATERAL (
    SELECT f.at FROM {{schema}}.{{prefix}}marks f
    WHERE x.eff = 1 AND f.gk = hashtextextended(m.tenant || chr(31) || m.topic || chr(31) || m.grp, 0)
        AND f.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END AND f.done >= m.seq
        AND f.tenant = m.tenant AND f.topic = m.topic AND f.grp = m.grp
    ORDER BY f.gk, f.part, f.done, f.mseq LIMIT 1) f ON true;
