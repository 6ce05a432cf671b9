-- The store's settings that every process on the database must share.
-- 'storage' = 'append-only' records Options.AppendOnly (issue #28): a store
-- of the other kind refuses to start on the database (see Store.Ping).
CREATE TABLE {{schema}}.{{prefix}}settings (
    name  text NOT NULL,
    value text NOT NULL,
    CONSTRAINT {{prefix}}settings_pkey PRIMARY KEY (name)
);
