-- One statement (atomic DDL): MySQL 8 has no DROP COLUMN IF EXISTS.
ALTER TABLE {{prefix}}messages
    DROP COLUMN claim_token;
