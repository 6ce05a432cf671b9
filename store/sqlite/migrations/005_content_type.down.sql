-- Refuses while a message holds a non-JSON payload (a BLOB): the older
-- schema would read it as JSON and lose its content type. Delete (or prune)
-- those messages first.
CREATE TEMP TABLE {{prefix}}payload_down_check (
    n INTEGER CONSTRAINT "messages hold non-JSON payloads: delete them before migrating below version 5" CHECK (n = 0)
);
INSERT INTO temp.{{prefix}}payload_down_check SELECT count(*) FROM {{prefix}}messages WHERE typeof(payload) = 'blob';
DROP TABLE temp.{{prefix}}payload_down_check;
ALTER TABLE {{prefix}}messages DROP COLUMN content_type;
