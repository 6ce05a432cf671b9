-- outboxkit store/mysql schema, version 4: a dead letter can hold its group
-- (outbox.DeadLetterBlock). blocks_group is 1 only on a FAILED message
-- dead-lettered under that policy; the claim treats such a message as an
-- open one of its group (like a message waiting for a retry). The claim
-- finds it through messages_group_status (status 'FAILED' of the group),
-- so no index is added. One ALTER: atomic on MySQL 8 and MariaDB, and
-- instant (a column with a default).

ALTER TABLE {{prefix}}messages ADD COLUMN blocks_group BOOLEAN NOT NULL DEFAULT FALSE;
