ALTER TABLE {{schema}}.{{prefix}}pauses
    ALTER COLUMN pause_topic TYPE text COLLATE "default",
    ALTER COLUMN pause_grp TYPE text COLLATE "default",
    ALTER COLUMN pause_tenant TYPE text COLLATE "default";
ALTER TABLE {{schema}}.{{prefix}}inbox
    ALTER COLUMN consumer TYPE text COLLATE "default",
    ALTER COLUMN tenant TYPE text COLLATE "default",
    ALTER COLUMN message_id TYPE text COLLATE "default";
ALTER TABLE {{schema}}.{{prefix}}attempts
    ALTER COLUMN message_id TYPE text COLLATE "default";
ALTER TABLE {{schema}}.{{prefix}}messages
    ALTER COLUMN id TYPE text COLLATE "default",
    ALTER COLUMN tenant TYPE text COLLATE "default",
    ALTER COLUMN topic TYPE text COLLATE "default",
    ALTER COLUMN grp TYPE text COLLATE "default",
    ALTER COLUMN idempotency_key TYPE text COLLATE "default",
    ALTER COLUMN provider_message_id TYPE text COLLATE "default";
