DROP INDEX {{schema}}.{{prefix}}messages_group_active;
CREATE INDEX {{prefix}}messages_group_active ON {{schema}}.{{prefix}}messages (tenant, topic, grp, seq)
    WHERE status IN ('PENDING', 'PROCESSING') AND grp <> '';
ALTER TABLE {{schema}}.{{prefix}}messages DROP COLUMN blocks_group;
