DROP INDEX {{schema}}.{{prefix}}messages_idempotency;
ALTER TABLE {{schema}}.{{prefix}}messages
    ADD CONSTRAINT {{prefix}}messages_idempotency UNIQUE (tenant, idempotency_key);
