DROP INDEX IF EXISTS {{prefix}}messages_open_group_idx;
CREATE INDEX {{prefix}}messages_open_group_idx
    ON {{prefix}}messages (tenant, topic, grp, seq) WHERE status IN ('PENDING', 'PROCESSING');
ALTER TABLE {{prefix}}messages DROP COLUMN blocks_group;
