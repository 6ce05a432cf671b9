ALTER TABLE {{prefix}}messages
    DROP COLUMN claim_token;
