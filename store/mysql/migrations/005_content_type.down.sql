-- Refuses while a message holds a non-JSON payload: the older schema would
-- read it as JSON and lose its content type. Delete (or prune) those
-- messages first.
CREATE TEMPORARY TABLE IF NOT EXISTS {{prefix}}payload_down_check (
    n BIGINT,
    CONSTRAINT non_json_payloads_exist_delete_them_first CHECK (n = 0)
);
INSERT INTO {{prefix}}payload_down_check
    SELECT count(*) FROM {{prefix}}messages
    WHERE content_type <> ''
      AND LOWER(TRIM(SUBSTRING_INDEX(content_type, ';', 1))) <> 'application/json'
      AND LOWER(TRIM(SUBSTRING_INDEX(content_type, ';', 1))) NOT LIKE '%+json';
DROP TEMPORARY TABLE IF EXISTS {{prefix}}payload_down_check;
SET @outboxkit_ddl = IF(EXISTS(SELECT 1 FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}messages' AND column_name = 'content_type'),
    'ALTER TABLE {{prefix}}messages DROP COLUMN content_type',
    'DO 0');
PREPARE outboxkit_stmt FROM @outboxkit_ddl;
EXECUTE outboxkit_stmt;
DEALLOCATE PREPARE outboxkit_stmt;
