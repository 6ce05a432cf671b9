ALTER TABLE {{prefix}}messages DROP INDEX {{prefix}}messages_head;
