-- outboxkit store/mysql schema, version 5: payloads with a content type.
-- content_type '' means application/json (every row written before this
-- version). payload stays MEDIUMBLOB, the caller's bytes exactly, whatever
-- their type; its 16 MiB bound (less room for the rest of the row) is the
-- store's payload ceiling. The column is added only when missing (MySQL 8
-- has no ADD COLUMN IF NOT EXISTS), so the migration can run again; InnoDB
-- adds it in place, without copying the table.

SET @outboxkit_ddl = IF(EXISTS(SELECT 1 FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}messages' AND column_name = 'content_type'),
    'DO 0',
    "ALTER TABLE {{prefix}}messages ADD COLUMN content_type VARBINARY(255) NOT NULL DEFAULT ''");
PREPARE outboxkit_stmt FROM @outboxkit_ddl;
EXECUTE outboxkit_stmt;
DEALLOCATE PREPARE outboxkit_stmt;
