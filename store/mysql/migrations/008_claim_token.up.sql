-- outboxkit store/mysql schema, version 8: a claim token per claim
-- (outbox.Message.ClaimToken), kept while a message is PROCESSING and
-- cleared when it leaves it. Outcomes and lease renewals must carry it:
-- owner and attempt alone cannot tell two claims apart when a release or a
-- recovered lease gave the attempt back and the same processor claimed the
-- message again. Rows leased before this version have none (NULL): an
-- outcome without a token still finishes them, and lease recovery recovers
-- them as before. A nullable column with no default, added last: InnoDB
-- adds it in place (instantly on MySQL 8 and MariaDB 10.3+), without
-- copying the table. Added only when missing (MySQL 8 has no ADD COLUMN IF
-- NOT EXISTS), so the migration can run again.

SET @outboxkit_ddl = IF(EXISTS(SELECT 1 FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}messages' AND column_name = 'claim_token'),
    'DO 0',
    "ALTER TABLE {{prefix}}messages ADD COLUMN claim_token VARBINARY(64) NULL");
PREPARE outboxkit_stmt FROM @outboxkit_ddl;
EXECUTE outboxkit_stmt;
DEALLOCATE PREPARE outboxkit_stmt;
