ALTER TABLE {{schema}}.{{prefix}}messages
    DROP COLUMN claim_token;
