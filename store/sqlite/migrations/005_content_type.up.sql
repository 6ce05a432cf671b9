-- outboxkit SQLite schema, version 5: payloads with a content type.
-- content_type '' means application/json (every row written before this
-- version). JSON payloads stay TEXT, so json_extract(payload, ...) reads
-- them as before; other payloads are stored as BLOBs, byte for byte.

ALTER TABLE {{prefix}}messages ADD COLUMN content_type TEXT NOT NULL DEFAULT '';
