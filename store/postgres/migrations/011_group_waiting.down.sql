CREATE INDEX {{prefix}}messages_group_active ON {{schema}}.{{prefix}}messages (tenant, topic, grp, seq)
    WHERE (status IN ('PENDING', 'PROCESSING') OR blocks_group) AND grp <> '';
CREATE INDEX {{prefix}}messages_processing ON {{schema}}.{{prefix}}messages (claimed_at)
    WHERE status = 'PROCESSING';
DROP INDEX {{schema}}.{{prefix}}messages_group_waiting;
DROP INDEX {{schema}}.{{prefix}}messages_leased;
