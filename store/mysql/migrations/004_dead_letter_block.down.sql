ALTER TABLE {{prefix}}messages DROP COLUMN blocks_group;
