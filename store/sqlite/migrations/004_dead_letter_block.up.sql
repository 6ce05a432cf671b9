-- outboxkit SQLite schema, version 4: a dead letter can hold its group
-- (outbox.DeadLetterBlock). blocks_group is 1 only on a FAILED message
-- dead-lettered under that policy; the claim treats such a message as an
-- open one of its group (like a message waiting for a retry), so the group
-- index covers it too.

ALTER TABLE {{prefix}}messages ADD COLUMN blocks_group INTEGER NOT NULL DEFAULT 0;

DROP INDEX IF EXISTS {{prefix}}messages_open_group_idx;
CREATE INDEX {{prefix}}messages_open_group_idx
    ON {{prefix}}messages (tenant, topic, grp, seq) WHERE status IN ('PENDING', 'PROCESSING') OR blocks_group = 1;
