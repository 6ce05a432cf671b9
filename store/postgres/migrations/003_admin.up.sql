-- outboxkit store/postgres schema, version 3: paused topics and groups
-- (outbox.Admin). A row pauses pause_topic; pause_grp '' means every group
-- of it, pause_tenant '' every tenant. The claim skips what a row covers.
-- The schema and table-prefix placeholders are replaced by Options.Schema and
-- Options.TablePrefix (validated identifiers).

CREATE TABLE {{schema}}.{{prefix}}pauses (
    pause_topic  text        NOT NULL,
    pause_grp    text        NOT NULL DEFAULT '',
    pause_tenant text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    CONSTRAINT {{prefix}}pauses_pkey PRIMARY KEY (pause_topic, pause_grp, pause_tenant)
);
