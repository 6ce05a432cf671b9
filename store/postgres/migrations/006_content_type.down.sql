-- Refuses while a message holds a non-JSON payload: the older schema has
-- no place for it. Delete (or prune) those messages first.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.{{prefix}}messages WHERE payload IS NULL) THEN
        RAISE EXCEPTION 'messages hold non-JSON payloads (payload_bytes): delete them before migrating below version 6';
    END IF;
END
$$;
ALTER TABLE {{schema}}.{{prefix}}messages
    DROP CONSTRAINT {{prefix}}messages_payload_one,
    DROP COLUMN payload_bytes,
    DROP COLUMN content_type,
    ALTER COLUMN payload SET NOT NULL;
