ALTER TABLE {{prefix}}messages
    DROP COLUMN recoveries;
