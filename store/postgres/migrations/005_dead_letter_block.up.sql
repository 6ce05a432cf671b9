-- A dead letter can hold its group (outbox.DeadLetterBlock). blocks_group
-- is true only on a FAILED message dead-lettered under that policy; the
-- claim treats such a message as an open one of its group (like a message
-- waiting for a retry), so the group index covers it too. Adding a column
-- with a constant default rewrites nothing.
ALTER TABLE {{schema}}.{{prefix}}messages ADD COLUMN blocks_group boolean NOT NULL DEFAULT false;

DROP INDEX {{schema}}.{{prefix}}messages_group_active;
CREATE INDEX {{prefix}}messages_group_active ON {{schema}}.{{prefix}}messages (tenant, topic, grp, seq)
    WHERE (status IN ('PENDING', 'PROCESSING') OR blocks_group) AND grp <> '';
