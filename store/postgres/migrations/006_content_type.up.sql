-- Payloads with a content type. content_type '' means application/json
-- (every row written before this version). JSON payloads (application/json
-- and "+json" types) stay in payload (json, the caller's bytes exactly), so
-- operators' queries and triggers read them as before; every other content
-- type (protobuf, binary) goes to payload_bytes (bytea), byte for byte.
-- Exactly one of the two is set. Adding columns with a constant default and
-- dropping NOT NULL change only the catalog (no table rewrite); the CHECK
-- is NOT VALID because the rows written before hold payload only, which
-- it allows, so the table is not scanned under an exclusive lock.
ALTER TABLE {{schema}}.{{prefix}}messages
    ADD COLUMN content_type text NOT NULL DEFAULT '',
    ADD COLUMN payload_bytes bytea,
    ALTER COLUMN payload DROP NOT NULL,
    ADD CONSTRAINT {{prefix}}messages_payload_one CHECK ((payload IS NULL) <> (payload_bytes IS NULL)) NOT VALID;
