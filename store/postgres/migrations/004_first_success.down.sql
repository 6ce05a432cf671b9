-- Keep the history: first-attempt successes recorded on the message row
-- become attempt rows again.
INSERT INTO {{schema}}.{{prefix}}attempts (message_id, tenant, number, outcome, provider_response, started_at, finished_at)
SELECT m.id, m.tenant, 1, 'SUCCEEDED', m.sent_response, m.sent_started_at, m.sent_finished_at
FROM {{schema}}.{{prefix}}messages m
WHERE m.sent_finished_at IS NOT NULL;
ALTER TABLE {{schema}}.{{prefix}}messages
    DROP COLUMN sent_response,
    DROP COLUMN sent_started_at,
    DROP COLUMN sent_finished_at;
