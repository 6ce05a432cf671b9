-- Each claim of a message gets a token of its own (outbox.Message.ClaimToken),
-- kept while the message is PROCESSING and cleared when it leaves it. Outcomes
-- and lease renewals must carry it: owner and attempt alone cannot tell two
-- claims apart when a release or a recovered lease gave the attempt back and
-- the same processor claimed the message again. A nullable column without a
-- default changes only the catalog (no table rewrite). Rows leased before
-- this version have none (NULL): an outcome without a token still finishes
-- them, and lease recovery recovers them as before. Not indexed: the claim's
-- update stays a candidate for HOT as before.
ALTER TABLE {{schema}}.{{prefix}}messages
    ADD COLUMN claim_token uuid;
