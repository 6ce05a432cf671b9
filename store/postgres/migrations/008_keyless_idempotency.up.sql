-- The idempotency index holds only messages enqueued with a key of their
-- own. A message enqueued without one takes its ID as its key; the primary
-- key already makes that unique, so indexing it twice was one more B-tree
-- entry per row version (three per message on the common path: enqueue,
-- claim, sent) for nothing. The enqueue matches a keyless message against
-- the keys of keyed ones, and a keyed one against the IDs of keyless ones,
-- so a key repeated either way still returns the first message.
-- Building the index reads the table once (under the migration's lock);
-- every row satisfies it, since the constraint it replaces was stricter.
ALTER TABLE {{schema}}.{{prefix}}messages DROP CONSTRAINT {{prefix}}messages_idempotency;
CREATE UNIQUE INDEX {{prefix}}messages_idempotency ON {{schema}}.{{prefix}}messages (tenant, idempotency_key)
    WHERE idempotency_key <> id;
