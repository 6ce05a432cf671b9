-- Leaving append-only storage: what the marks say goes into the message
-- rows (as in 013's down), and the marks are emptied, so a store on the
-- default path sees every message in its state.
WITH latest AS (
    SELECT DISTINCT ON (tenant, topic, grp, part) tenant, topic, grp, part, kind, done, upto, token, owner, at
    FROM {{schema}}.{{prefix}}marks ORDER BY tenant, topic, grp, part, mseq DESC
)
UPDATE {{schema}}.{{prefix}}messages m SET
    status = CASE WHEN m.seq <= l.done THEN 'SENT' ELSE 'PROCESSING' END,
    attempts = m.attempts + 1,
    sent_at = CASE WHEN m.seq <= l.done THEN (SELECT min(k.at) FROM {{schema}}.{{prefix}}marks k
        WHERE k.tenant = m.tenant AND k.topic = m.topic AND k.grp = m.grp AND k.part = l.part AND k.done >= m.seq) END,
    updated_at = CASE WHEN m.seq <= l.done THEN (SELECT min(k.at) FROM {{schema}}.{{prefix}}marks k
        WHERE k.tenant = m.tenant AND k.topic = m.topic AND k.grp = m.grp AND k.part = l.part AND k.done >= m.seq) ELSE l.at END,
    claimed_at = CASE WHEN m.seq > l.done THEN l.at ELSE m.claimed_at END,
    claimed_by = CASE WHEN m.seq > l.done THEN l.owner ELSE m.claimed_by END,
    claim_token = CASE WHEN m.seq > l.done THEN l.token END
FROM latest l
WHERE m.status = 'PENDING' AND l.tenant = m.tenant AND l.topic = m.topic AND l.grp = m.grp
    AND l.part = CASE WHEN m.grp = '' THEN m.seq ELSE 0 END
    AND (m.seq <= l.done OR (l.kind = 'lease' AND m.seq <= l.upto));

DELETE FROM {{schema}}.{{prefix}}marks;

DROP TABLE {{schema}}.{{prefix}}settings;

-- Append-only storage dropped the default path's claim indexes and built
-- its own (Migrate with Options.AppendOnly): the reverse.
DROP INDEX IF EXISTS {{schema}}.{{prefix}}messages_unordered_seq;
ALTER TABLE {{schema}}.{{prefix}}messages SET (fillfactor = 85);
CREATE INDEX IF NOT EXISTS {{prefix}}messages_claim_ordered ON {{schema}}.{{prefix}}messages (seq)
    WHERE status = 'PENDING' AND grp <> '';
CREATE INDEX IF NOT EXISTS {{prefix}}messages_claim_unordered ON {{schema}}.{{prefix}}messages (next_attempt_at)
    WHERE status = 'PENDING' AND grp = '';
CREATE INDEX IF NOT EXISTS {{prefix}}messages_tenant_seq_unleased ON {{schema}}.{{prefix}}messages (tenant, seq)
    WHERE claimed_by IS NULL;
