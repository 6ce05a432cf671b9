DROP TABLE IF EXISTS {{prefix}}pauses;
