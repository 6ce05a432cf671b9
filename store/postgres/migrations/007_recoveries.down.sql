ALTER TABLE {{schema}}.{{prefix}}messages
    DROP COLUMN recoveries;
