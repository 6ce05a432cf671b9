DROP TABLE IF EXISTS {{schema}}.{{prefix}}inbox;
