DROP TABLE IF EXISTS {{schema}}.{{prefix}}pauses;
