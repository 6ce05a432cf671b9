DROP TABLE IF EXISTS {{schema}}.{{prefix}}attempts;
DROP TABLE IF EXISTS {{schema}}.{{prefix}}messages;
