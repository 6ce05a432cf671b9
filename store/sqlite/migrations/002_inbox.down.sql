DROP INDEX IF EXISTS {{prefix}}inbox_handled_idx;
DROP TABLE IF EXISTS {{prefix}}inbox;
