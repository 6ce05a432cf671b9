-- outboxkit store/mysql schema, version 7: an index for the claim's head
-- scan. The claim finds group heads by reading PENDING ordered messages in
-- sequence order until it has enough. messages_claim (status, grp, seq)
-- gives that order only within one grp value (it serves the unordered
-- messages, grp ''): for grp <> '' the server read every PENDING ordered
-- message, checked its group and sorted them all, so a claim's cost grew
-- with the backlog (1.2-1.9 s for a claim of 500 over 100,000 messages in
-- 1,000 groups). messages_head gives the order itself and holds every
-- column the head scan reads, so the scan stops after the heads it needs
-- and visits no row. One ALTER: atomic on MySQL 8 and MariaDB.

ALTER TABLE {{prefix}}messages
    ADD INDEX {{prefix}}messages_head (status, seq, tenant, topic, grp, next_attempt_at);
