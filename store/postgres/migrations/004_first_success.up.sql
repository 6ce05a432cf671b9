-- A first-attempt success is recorded on the message row (sent_response,
-- sent_started_at, sent_finished_at) instead of as a row of the attempts
-- table: one heap row and two index entries less per message on the common
-- path. AttemptList shows it as attempt 1 all the same; a requeue moves it
-- to the attempts table.
ALTER TABLE {{schema}}.{{prefix}}messages
    ADD COLUMN sent_response json,
    ADD COLUMN sent_started_at timestamptz,
    ADD COLUMN sent_finished_at timestamptz;
