-- A claim token per claim (outbox.Message.ClaimToken), kept while a message
-- is PROCESSING and cleared when it leaves it. Outcomes and lease renewals
-- must carry it: owner and attempt alone cannot tell two claims apart when
-- a release or a recovered lease gave the attempt back and the same
-- processor claimed the message again. Rows leased before this version have
-- none (NULL): an outcome without a token still finishes them, and lease
-- recovery recovers them as before. A column with no default: SQLite
-- changes only the schema, not the rows.
ALTER TABLE {{prefix}}messages
    ADD COLUMN claim_token TEXT;
