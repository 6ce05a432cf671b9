-- Identifiers compare byte by byte (COLLATE "C"): IDs, tenants, topics,
-- groups, keys and provider message IDs are matched for equality and kept
-- in index order, never sorted for people, and under the database's
-- default collation every B-tree comparison of them went through the
-- locale's collation routine (an index insertion makes a dozen of them;
-- a message's three row versions insert into four indexes each). Byte
-- order is a total order consistent with equality, so every lookup and
-- uniqueness rule means what it meant. Changing a column's collation
-- rewrites no table, only the indexes on the column (rebuilt under the
-- migration's lock).
ALTER TABLE {{schema}}.{{prefix}}messages
    ALTER COLUMN id TYPE text COLLATE "C",
    ALTER COLUMN tenant TYPE text COLLATE "C",
    ALTER COLUMN topic TYPE text COLLATE "C",
    ALTER COLUMN grp TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C",
    ALTER COLUMN provider_message_id TYPE text COLLATE "C";
ALTER TABLE {{schema}}.{{prefix}}attempts
    ALTER COLUMN message_id TYPE text COLLATE "C";
ALTER TABLE {{schema}}.{{prefix}}inbox
    ALTER COLUMN consumer TYPE text COLLATE "C",
    ALTER COLUMN tenant TYPE text COLLATE "C",
    ALTER COLUMN message_id TYPE text COLLATE "C";
ALTER TABLE {{schema}}.{{prefix}}pauses
    ALTER COLUMN pause_topic TYPE text COLLATE "C",
    ALTER COLUMN pause_grp TYPE text COLLATE "C",
    ALTER COLUMN pause_tenant TYPE text COLLATE "C";
