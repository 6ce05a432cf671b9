DROP TABLE IF EXISTS {{prefix}}inbox;
