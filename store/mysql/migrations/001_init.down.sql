DROP TABLE IF EXISTS {{prefix}}groups;
DROP TABLE IF EXISTS {{prefix}}attempts;
DROP TABLE IF EXISTS {{prefix}}messages;
